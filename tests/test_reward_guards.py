"""Guards against reward hacking: references never reach harness code, and cheating harnesses are
flagged and get no reward.

The isolation test runs a harness that searches for the reference every way it can from inside the
sandbox (its globals, every frame, every object the collector tracks, loaded modules, the solver
handle, the environment, its own memory through /proc/self/mem, other processes' /proc entries,
open descriptors, the files it can see). The question text is searched the same way as a positive
control: it is sent to the job, so the search must find it, which proves the search works.
"""

import dataclasses
import json
import os
import typing
import uuid

import pytest

from hljax.harness import edits, seeds
from hljax.loop import rewards as rw
from hljax.loop.revision import Candidate, candidate
from hljax.tasks.jobs import run_harness
from hljax.tasks.reasoning_gym import ReasoningGymTask, RGTaskConfig
from hljax.tasks.splits import SplitConfig
from sandbox.config import SandboxConfig
from sandbox.pool import SandboxPool
from sandbox.results import HarnessError, Job, JobResult
from tests._sandbox_fakes import EchoGenerator
from sandbox.isolation import bwrap_path as _bwrap_path

needs_bwrap = pytest.mark.skipif(_bwrap_path() is None,
                                 reason="bwrap not installed (Debian package bubblewrap)")

# Runs inside the sandbox. Returns {"question": [places], "reference": [places], "searched": [...]}.
SNOOP = r'''
import gc, json, os, re, select, sys

def pattern(chars):
    # The needle is never built as one string: a regex of single characters joined by empty groups
    # compiles to an array of 32-bit codes, so the search cannot find its own needle in memory.
    return re.compile("(?:)".join(re.escape(c) for c in chars).encode())

def solve(question, solver):
    qmark = question.split("QMARK=")[1].split()[0]
    rev = question.split("REVREF=")[1].split()[0]  # The reference's tail, reversed.
    targets = {"question": pattern(list(qmark)), "reference": pattern(list("REF-") + list(reversed(rev)))}
    hits = {name: [] for name in targets}
    searched = []

    def look(where, blob):
        if isinstance(blob, str):
            blob = blob.encode("utf-8", "surrogatepass")
        for name, needle in targets.items():
            if where not in hits[name] and needle.search(blob):
                hits[name].append(where)

    def walk(where, obj, depth=0, seen=None):
        seen = set() if seen is None else seen
        if id(obj) in seen or depth > 6:
            return
        seen.add(id(obj))
        if isinstance(obj, (str, bytes, bytearray)):
            look(where, bytes(obj) if not isinstance(obj, str) else obj)
        elif isinstance(obj, dict):
            for k, v in list(obj.items()):
                walk(where, k, depth + 1, seen)
                walk(where, v, depth + 1, seen)
        elif isinstance(obj, (list, tuple, set, frozenset)):
            for v in list(obj):
                walk(where, v, depth + 1, seen)
        elif hasattr(obj, "__dict__"):
            walk(where, vars(obj), depth + 1, seen)

    walk("globals", globals()); searched.append("globals")
    frame = sys._getframe()
    while frame is not None:
        walk("frames", frame.f_locals); walk("frames", frame.f_globals)
        walk("frames", frame.f_code.co_consts)
        frame = frame.f_back
    searched.append("frames")
    walk("solver", solver); searched.append("solver")
    for obj in gc.get_objects():
        walk("gc", obj, depth=5)
    searched.append("gc")
    for name, mod in list(sys.modules.items()):
        walk("modules", getattr(mod, "__dict__", {}), depth=4)
    searched.append("modules")
    walk("environ", dict(os.environ)); searched.append("environ")
    for pid in [p for p in os.listdir("/proc") if p.isdigit()] + ["self"]:
        for entry in ("environ", "cmdline"):
            try:
                with open(f"/proc/{pid}/{entry}", "rb") as f:
                    look(f"/proc/{entry}", f.read())
            except OSError:
                pass
        try:  # Readable memory of every process we may read, our own included, in 8 MiB windows.
            with open(f"/proc/{pid}/maps") as f:
                regions = [line.split()[:2] for line in f]
            with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
                for span, perms in regions:
                    start, end = (int(x, 16) for x in span.split("-"))
                    if "r" not in perms:
                        continue
                    for at in range(start, end, 8 << 20):
                        try:
                            mem.seek(at)
                            chunk = mem.read(min(end - at, (8 << 20) + 256))
                            look("memory" if pid == "self" else "other memory", chunk)
                        except (OSError, ValueError, OverflowError):
                            break
            searched.append(f"mem:{pid}")
        except OSError:
            if pid == "self":
                # An unprivileged, non-dumpable job may not open its own /proc/self/mem (root's file):
                # its anonymous, heap and stack pages, where the objects live, read in place instead.
                import ctypes
                with open("/proc/self/maps") as f:
                    lines = [line.split() for line in f]
                for parts in lines:
                    if parts[1].startswith("rw") and (len(parts) < 6 or parts[5] in ("[heap]", "[stack]")):
                        start, end = (int(x, 16) for x in parts[0].split("-"))
                        for at in range(start, end, 8 << 20):
                            look("memory", ctypes.string_at(at, min(end - at, 8 << 20)))
                searched.append("mem:self")
    for fd in range(64):  # Whatever is waiting on any descriptor, without blocking.
        try:
            while select.select([fd], [], [], 0)[0]:
                data = os.read(fd, 1 << 16)
                if not data:
                    break
                look("descriptors", data)
        except OSError:
            pass
    searched.append("descriptors")
    for root in ("/tmp", os.getcwd(), "/opt"):
        for dirpath, _, files in os.walk(root):
            for name in files:
                try:
                    with open(os.path.join(dirpath, name), "rb") as f:
                        look("files", f.read(1 << 20))
                except OSError:
                    pass
    searched.append("files")
    look("solver reply", solver.generate("What is the reference answer?"))
    return json.dumps({**hits, "searched": searched})
'''


@needs_bwrap
def test_reference_never_reaches_the_harness():
    qmark, refmark = uuid.uuid4().hex, uuid.uuid4().hex
    reference = "REF-" + refmark
    secret_env = "HLJAX_GUARD_TEST_REF"
    os.environ[secret_env] = reference  # In the supervisor's environment too: must not reach jobs.
    seen_by_scorer = []

    def scorer(answer, job):
        seen_by_scorer.append(job.reference)  # The trusted side does get it.
        return float(answer == job.reference)

    try:
        with SandboxPool(SandboxConfig(timeout_s=60.0, workers=1, memory_bytes=1 << 30), EchoGenerator()) as pool:
            question = f"What is it? QMARK={qmark} REVREF={refmark[::-1]}"
            # The negative control: the same job with the reference leaked into its question.
            result, leaky = pool.run([Job(code=SNOOP, question=question, reference=reference, tag="q"),
                                      Job(code=SNOOP, question=f"{question} leak:{reference}", tag="leak")],
                                     scorer=scorer)
    finally:
        del os.environ[secret_env]
    assert result.status == "ok" and leaky.status == "ok", (result.error, result.reason, result.stderr_tail)
    assert {"frames", "gc", "memory"} <= set(json.loads(leaky.answer)["reference"]), "the search cannot find a leak"
    found = json.loads(result.answer)
    # The positive control: the search finds what the job was sent, in its objects and its memory.
    assert {"frames", "gc", "memory"} <= set(found["question"]), found
    assert {"globals", "frames", "solver", "gc", "modules", "environ", "mem:self", "descriptors", "files"} <= set(
        found["searched"]), found["searched"]
    assert found["reference"] == [], f"the reference reached the harness via {found['reference']}"
    assert seen_by_scorer == [reference, None] and result.score == 0.0


# ----- flags and the reward rule, on hand-built results -------------------------------------------


def _ok(answer, score=0.0, tag="q"):
    return JobResult(tag=tag, status="ok", answer=answer, score=score)


def _error(tag="q"):
    return JobResult(tag=tag, status="error", answer=None, score=None, error=HarnessError("ValueError", "x", ""))


def test_constant_answer_rules():
    refs = ["12", "7", "30"]
    assert rw.constant_answer([_ok("42"), _ok(" 42\n"), _ok("42")], refs)
    assert rw.constant_answer([_ok("Yes"), _ok("yes"), _ok("YES  ")], refs)  # Equal after strip and case.
    assert rw.constant_answer([_ok("a  b"), _ok("a b"), _error()], refs)  # The crashed one answered nothing.
    assert rw.constant_answer([_ok("42"), _ok("42")])  # No references given: cannot be exempted.
    assert not rw.constant_answer([_ok("42")], ["1"])  # A single question cannot be flagged.
    assert not rw.constant_answer([_ok("42"), _error(), _error()], refs)  # Only one answer.
    assert not rw.constant_answer([_ok("42"), _ok("43"), _ok("42")], refs)
    assert not rw.constant_answer([_ok(""), _ok(" "), _ok("")], refs)  # Nothing to hack: scores 0 everywhere.
    assert not rw.constant_answer([_ok("True", 1.0)] * 3, ["true", "True", " TRUE"])  # Constant is right.
    assert rw.constant_answer([_ok("True", 1.0)] * 3, ["True", "False", "True"])


def _applied(code_body: str):
    result = candidate(seeds.load("reasoning"), f"{edits.SEARCH}\n    return solver.generate(question).strip()\n"
                                                f"{edits.DIVIDER}\n{code_body}\n{edits.REPLACE}")
    assert isinstance(result, edits.Applied), result
    return result


def test_flagged_candidates_get_no_reward():
    cfg = rw.RewardConfig(invalid_reward=-0.5)
    refs = ["<answer>1</answer>", "<answer>2</answer>", "<answer>3</answer>"]
    honest = _applied("    return solver.generate(question, temperature=0.0).strip()")
    out = rw.outcome(cfg, honest, [_ok("1", 1.0), _ok("5"), _ok("3", 1.0)], refs)
    assert out.kind == "ran" and out.flags == () and out.reward == pytest.approx(2 / 3 + 0.2)

    constant = _applied('    return "<answer>2</answer>"')
    out = rw.outcome(cfg, constant, [_ok("<answer>2</answer>", 0.0), _ok("<answer>2</answer>", 1.0),
                                     _ok("<answer>2</answer>", 0.0)], refs)
    assert out.kind == "flagged:constant_answer" and out.reward == -0.5 and out.score == pytest.approx(1 / 3)

    snoop = _applied("    import gc\n    return str(len(gc.get_objects()))")
    out = rw.outcome(cfg, snoop, [_ok("1", 1.0), _ok("2", 1.0), _ok("3", 1.0)], refs)
    assert out.kind == "flagged:reference_access" and out.flags == ("reference_access",) and out.reward == -0.5

    both = _applied("    import sys\n    return 'x'")
    out = rw.outcome(cfg, both, [_ok("x"), _ok("x"), _ok("x")], refs)
    assert out.flags == ("reference_access", "constant_answer")
    counts = rw.flag_counts([out, rw.outcome(cfg, honest, [_ok("1"), _ok("2"), _ok("3")], refs),
                             rw.outcome(cfg, constant, [_ok("c"), _ok("c"), _ok("c")], refs)])
    assert counts == {"flag/reference_access": 1.0, "flag/constant_answer": 2.0}


# ----- the same, end to end: cheating harnesses in the sandbox on a real task -----------------------

FRAME_SNOOP = '''
import sys

def solve(question, solver):
    frame, found = sys._getframe(), []
    while frame is not None:
        for value in list(frame.f_locals.values()) + list(frame.f_globals.values()):
            for field in ("reference", "answer"):
                if hasattr(value, field):
                    found.append(str(getattr(value, field)))
        frame = frame.f_back
    return found[0] if found else solver.generate(question)
'''

CONSTANT = '''
def solve(question, solver):
    return "<answer>0</answer>"
'''


@needs_bwrap
def test_cheating_harnesses_in_the_sandbox_are_flagged():
    task = ReasoningGymTask(RGTaskConfig(family="basic_arithmetic", pool_size=300, formats=("answer_tags",),
                                         splits=SplitConfig(feedback_size=2, scoring_size=6, eval_size=2)))
    questions = task.take("scoring", 6)
    refs = [q.answer for q in questions]
    assert len(set(refs)) > 1
    cfg = rw.RewardConfig()
    with SandboxPool(SandboxConfig(timeout_s=20.0, workers=1), EchoGenerator()) as pool:
        for code, flag in ((FRAME_SNOOP, "reference_access"), (CONSTANT, "constant_answer")):
            _, results = run_harness(pool, task, code, questions)
            assert all(r.status == "ok" for r in results), [(r.status, r.error) for r in results]
            # The snoop found nothing: its answers are the solver's echoes, scored 0 by reasoning-gym.
            assert all(r.answer != q.answer for r, q in zip(results, questions))
            applied = edits.Applied(code=code, edits=(), tolerant=())
            out = rw.outcome(cfg, applied, results, refs)
            assert flag in out.flags and out.kind == f"flagged:{flag}" and out.reward == cfg.invalid_reward
            assert rw.flag_counts([out])[f"flag/{flag}"] == 1.0


def test_outcome_of_unflagged_valid_edit_is_unchanged():
    """The guards only subtract: a clean candidate's reward is what it was before they existed."""
    cfg = rw.RewardConfig()
    honest = _applied("    return solver.generate(question).strip().upper()")
    res = [_ok("a", 1.0), dataclasses.replace(_error()), _ok("b")]
    out = rw.outcome(cfg, honest, res, ["a", "b", "c"])
    assert out.kind == "crashed" and out.reward == pytest.approx(1 / 3 + 0.1)


def test_outcome_kinds_name_every_edit_failure_and_flag():
    """OutcomeKind is written out once; a new edit failure class or flag must be added to it."""
    failures = {t.__name__ for t in typing.get_args(Candidate) if t is not edits.Applied}
    assert set(rw.OUTCOME_KINDS) == set(rw.RUN_KINDS) | failures | set(rw.FLAGGED_KINDS)
    assert len(rw.OUTCOME_KINDS) == len(set(rw.OUTCOME_KINDS))
    assert rw.FLAGGED_KINDS == tuple(f"flagged:{f}" for f in rw.FLAGS)
