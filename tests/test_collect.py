"""The teacher SFT-data collector (hljax/data/collect.py) and its quality filters (hljax/harness/filters.py).

Expectations come from hand-written harnesses that cheat in known ways and from reasoning-gym's own
scorer, never from the collector's output: a scripted OpenAI-compatible teacher proposes one
revision per filter, and each must be rejected by that filter and no other reason.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from configs import collect_tiny
from hljax.config import ConfigError
from hljax.data import collect as co
from hljax.data.collect_config import CollectConfig
from hljax.harness import edits, filters as fl, seeds
from hljax.loop.revision import candidate
from hljax.rl import sft_data
from hljax.tasks.suite import build_tasks

SEED_RETURN = "    return solver.generate(question).strip()"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def block(replace: str, search: str = SEED_RETURN) -> str:
    return f"Reasoning first.\n\n{edits.SEARCH}\n{search}\n{edits.DIVIDER}\n{replace}\n{edits.REPLACE}\n"


def revised(replace: str) -> str:
    result = candidate(seeds.load("reasoning"), block(replace))
    assert isinstance(result, edits.Applied), result
    return result.code


# ----- the filters on hand-built harnesses -------------------------------------------------------------

CFG = fl.FilterConfig(fixed_sampling=("temperature",), max_code_lines=40)
PARENT = seeds.load("reasoning")


def test_valid_edit_names_the_failure():
    assert fl.valid_edit(candidate(PARENT, block("    return 'x'"))).ok
    bad = fl.valid_edit(candidate(PARENT, "no blocks here"))
    assert not bad.ok and bad.detail.startswith("Unparseable")
    noop = fl.valid_edit(candidate(PARENT, block(SEED_RETURN)))
    assert not noop.ok and noop.detail.startswith("NoOp")
    renamed = block("def answer(question, solver):\n    return '1'",
                    search="def solve(question: str, solver) -> str:\n" + SEED_RETURN)
    contract = fl.valid_edit(candidate(PARENT, renamed))
    assert not contract.ok and contract.detail.startswith("ContractViolation")


@pytest.mark.parametrize("body, found", [
    ("    import os\n    return os.environ.get('X', '')", "imports os"),
    ("    from inspect import currentframe\n    return str(currentframe())", "imports from inspect"),
    ("    return open('/proc/self/environ').read()", "calls open()"),
    ("    return str(globals())", "calls globals()"),
    ("    return eval('1+1')", "calls eval()"),
    ("    return getattr(solver, 'x' + 'y')", "computed attribute name"),
    ("    return str(solve.__globals__)", "attribute .__globals__"),
    ("    f = (lambda: 0).__code__\n    return str(f)", "attribute .__code__"),
    ("    return str(question.reference)", "attribute .reference"),
    ("    return str(__builtins__)", "name __builtins__"),
    ("    p = '/proc/1/' + 'mem'\n    return p", "path in literal"),
])
def test_reference_access_is_found(body, found):
    verdict = fl.no_reference_access(revised(body))
    assert not verdict.ok and found in verdict.detail, verdict


def test_ordinary_harnesses_pass_the_static_filters():
    body = ("    import re, json, math\n"
            "    replies = solver.generate_batch([question] * 2, max_new_tokens=64)\n"
            "    found = re.findall(r'<answer>(.*?)</answer>', ' '.join(replies))\n"
            "    return found[-1] if found else replies[0].strip()")
    code = revised(body)
    assert fl.no_reference_access(code).ok
    assert fl.no_hardcoded_answers(code, PARENT, ["7", "<answer>7</answer>", "hello world"], CFG).ok
    assert fl.solver_settings(code, fl.FilterConfig()).ok
    assert fl.size_limits(code, "x", CFG).ok


def test_hardcoded_answers():
    refs = ["106475279601", "<answer>noremopyh</answer>", "noremopyh", "3", "Final answer: 3"]
    cases = {
        "    return {'hypomeron': 'noremopyh'}.get(question, '')": ["noremopyh"],  # Whole literal.
        "    return 'The answer is NOREMOPYH today'": ["noremopyh"],  # Word inside a literal, any case.
        "    return str(106475279601)": ["106475279601"],  # Long numeric literal.
        "    return '3'": ["3"],  # Short reference: only a literal equal to it.
        "    return '<answer>' + '3' + '</answer>'": ["3"],
        "    return 'x3y' + str(3) + 'Step 3 of 4'": [],  # Short references never match inside text or numbers.
        "    return 'noremopyhs'": [],  # Not a whole word.
    }
    for body, hits in cases.items():
        assert list(fl.hardcoded_answers(revised(body), PARENT, refs, CFG)) == hits, body
    # Literals the parent already had are not the candidate's doing.
    parent = PARENT.replace("as in the paper.", "as in the paper. noremopyh")
    code = candidate(parent, block("    return solver.generate(question).upper()")).code
    assert fl.no_hardcoded_answers(code, parent, refs, CFG).ok


def test_solver_settings():
    fixed = fl.solver_settings(revised("    return solver.generate(question, temperature=0.0)"), CFG)
    assert not fixed.ok and "sets temperature" in fixed.detail
    assert fl.solver_settings(revised("    return solver.generate(question, max_new_tokens=9)"), CFG).ok
    spread = fl.solver_settings(revised("    kw = {'top_p': 0.5}\n    return solver.generate(question, **kw)"), CFG)
    assert not spread.ok and "**kwargs" in spread.detail
    for body, what in (("    solver.generate = lambda p, **k: 'x'\n    return 'x'", "rebinds solver.generate"),
                       ("    return str(solver._channel)", "touches solver._channel")):
        verdict = fl.solver_settings(revised(body), fl.FilterConfig())  # Refused even when nothing is fixed.
        assert not verdict.ok and what in verdict.detail


def test_size_and_improvement():
    long = revised("\n".join(["    # note"] * 50) + "\n" + SEED_RETURN.replace("strip", "lower"))
    assert not fl.size_limits(long, "x", CFG).ok
    assert not fl.size_limits("x", "y" * (CFG.max_completion_chars + 1), CFG).ok
    assert fl.improves(0.25, 0.5, CFG).ok and not fl.improves(0.5, 0.5, CFG).ok
    assert not fl.improves(0.5, 0.55, fl.FilterConfig(min_improvement=0.1)).ok


def test_read_rows_cuts_a_torn_last_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    good = [json.dumps({"id": f"t/r0/p{i}", "kept": False}) for i in range(2)]
    path.write_text("\n".join(good) + "\n" + '{"id": "t/r0/p2", "kep')
    assert [r["id"] for r in co.read_rows(str(path))] == ["t/r0/p0", "t/r0/p1"]
    assert path.read_text() == "\n".join(good) + "\n"  # The next append starts on a clean line.
    path.write_text(good[0] + "\nnot json\n" + good[1] + "\n")
    with pytest.raises(ValueError, match=r"rows.jsonl:2: not a JSON row"):
        co.read_rows(str(path))


# ----- the collector end to end with a scripted teacher --------------------------------------------------

LEGIT = r'''    import json, re
    word = re.search(r"->\s*nus\):\s*(\S+)", question).group(1)
    answer = word[::-1]
    demand = question.rsplit("Answer format:", 1)[-1]
    if "<answer>" in demand:
        return "<answer>" + answer + "</answer>"
    if "Final answer" in demand:
        return "Final answer: " + answer
    if "boxed" in demand:
        return "\\boxed{" + answer + "}"
    if "JSON" in demand:
        return json.dumps({"answer": answer})
    return answer'''


class ScriptedTeacher:
    """An OpenAI-compatible /v1/chat/completions endpoint that answers with prepared completions."""

    def __init__(self, completions):
        self.completions = completions
        self.requests = []
        teacher = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                teacher.requests.append(body)
                choices = [{"index": i, "message": {"role": "assistant", "content": c}, "finish_reason": "stop"}
                           for i, c in enumerate(teacher.completions[: body["n"]])]
                data = json.dumps({"model": body["model"], "choices": choices, "usage": {"prompt_tokens": 1}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"


def _tiny_config(tmp_path, **overrides):
    c = collect_tiny.get_config()
    c.out = str(tmp_path / "out" / "sft.jsonl")
    c.run_dir = str(tmp_path / "run")
    c.mesh.fsdp = 1
    for key, value in overrides.items():
        node, _, leaf = key.rpartition(".")
        setattr(c[node] if node else c, leaf, value)
    return c


@pytest.mark.slow
def test_collector_keeps_only_what_passes_every_filter(tmp_path):
    from hljax.checkpoint.presets import init_model

    solver_path = init_model("tiny", str(tmp_path / "solver"), seed=0)
    c = _tiny_config(tmp_path, **{"tasks.families": ("spell_backward",), "teacher.backend": "remote",
                                  "teacher.model": "scripted", "teacher.url": "http://set-below",
                                  "solver.path": solver_path,
                                  "filters.fixed_sampling": ("temperature",), "filters.max_code_lines": 60})
    # The hard-coding cheat copies the references shown in the report: the feedback questions'.
    (task,) = build_tasks(CollectConfig.from_config(c).tasks, c.seed)
    words = {q.payload.entry["question"].split()[-1]: q.payload.entry["answer"] for q in task.feedback_round(0)}
    script = {
        "kept": block(LEGIT),
        "no_hardcoded_answers": block(f"    answers = {words!r}\n"
                                      "    return '<answer>' + answers.get(question.split()[-1], '') + '</answer>'"),
        "no_reference_access": block("    import gc\n    return str(len(gc.get_objects()))"),
        "not_flagged": block("    return '<answer>yes</answer>'"),
        "runs_clean": block("    raise ValueError('not today')"),
        "valid_edit": "I would change the prompt, but here is no edit block.",
        "improves": block("    return question[::-1]"),  # Runs, differs per question, scores 0.
        "solver_settings": block("    return solver.generate(question, temperature=0.0).strip()"),
        "size_limits": block("\n".join(["    # padding"] * 80) + "\n" + SEED_RETURN.replace("strip", "lower")),
    }
    expected = list(script)
    teacher = ScriptedTeacher(list(script.values()))
    c.teacher.url = teacher.url
    c.proposals = len(script)
    cfg = CollectConfig.from_config(c)
    with co.Collector(cfg) as collector:
        summary = collector.run()

    kept = co.read_rows(cfg.out)
    rejected = {r["proposal"]: r for r in co.read_rows(cfg.rejected_path)}
    assert [r["proposal"] for r in kept] == [0]
    for k, want in enumerate(expected[1:], 1):
        row = rejected[k]
        assert row["reason"] == want and not row["kept"] and row["details"][want], (k, row["reason"], row["details"])
        failed = [name for name, ok in row["filters"].items() if not ok]
        # Nothing failed before it; a static rejection is never run; a harness that does not run or
        # is flagged does not improve either.
        assert failed == {"runs_clean": [want, "improves"], "not_flagged": [want, "improves"]}.get(want, [want]), failed
    assert rejected[expected.index("not_flagged")]["flags"] == ["constant_answer"]

    (row,) = kept
    assert all(row["filters"].values()) and len(row["filters"]) == 8 and row["flags"] == []
    # reasoning-gym's scorer gives the reversing harness full marks; the tiny random solver gives the seed none.
    assert row["scores"]["candidate"] == 1.0 and row["scores"]["candidate_feedback"] == 1.0
    assert row["scores"]["parent"] < 1.0
    (loaded,) = sft_data.load_rows(cfg.out)  # Directly usable as sft.data.
    assert loaded.completion == script["kept"] and loaded.harness == seeds.load("reasoning")
    assert loaded.messages[-1]["content"] == teacher.requests[0]["messages"][-1]["content"]
    assert "## Execution report" in loaded.messages[-1]["content"]
    assert teacher.requests[0]["n"] == len(script) and teacher.requests[0]["model"] == "scripted"
    assert summary["total"] == {"kept": 1, **{f"rejected:{r}": 1 for r in expected[1:]}}
    assert "kept" in co.format_summary(summary).splitlines()[0]

    # A rerun finds everything written and asks the teacher nothing more.
    with co.Collector(cfg) as collector:
        assert collector.run() == summary
    assert len(teacher.requests) == 1
    c.filters.min_improvement = 0.5  # Other settings: refused, naming the key.
    with pytest.raises(ConfigError, match="filters.min_improvement"):
        with co.Collector(CollectConfig.from_config(c)) as collector:
            collector.run()


# ----- kill and resume ---------------------------------------------------------------------------------


def _launch(tmp_path, name: str) -> subprocess.Popen:
    out = tmp_path / name / "sft.jsonl"
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1", JAX_PLATFORMS="cpu")
    cmd = [sys.executable, "-m", "launch.collect", "--config", os.path.join(ROOT, "configs", "collect_tiny.py"),
           f"--config.out={out}", f"--config.run_dir={tmp_path / 'run'}", "--config.rounds=2"]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _rows(tmp_path, name: str) -> list[dict]:
    stem = tmp_path / name / "sft"
    return co.read_rows(f"{stem}.jsonl") + co.read_rows(f"{stem}.rejected.jsonl")


def _written(tmp_path, name: str) -> int:
    return sum(os.path.exists(p) and open(p).read().count("\n")
               for p in (tmp_path / name / "sft.jsonl", tmp_path / name / "sft.rejected.jsonl"))


@pytest.mark.slow
def test_kill_and_resume_loses_nothing(tmp_path):
    """SIGKILL a collector mid-run, tear its last line, rerun: the rows equal an uninterrupted run's."""
    full = _launch(tmp_path, "full")
    stdout, _ = full.communicate(timeout=900)
    assert full.returncode == 0, stdout[-3000:]
    expected = {r["id"]: r for r in _rows(tmp_path, "full")}
    assert len(expected) == 2 * 2 * 3  # families x rounds x proposals

    victim = _launch(tmp_path, "resumed")
    deadline = time.monotonic() + 600
    while _written(tmp_path, "resumed") < 2 and victim.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    victim.send_signal(signal.SIGKILL)
    victim.communicate()
    partial = _rows(tmp_path, "resumed")
    assert 2 <= len(partial) < len(expected), f"the kill did not land mid-run: {len(partial)} rows"
    with open(tmp_path / "resumed" / "sft.rejected.jsonl", "a") as f:
        f.write('{"id": "rg/spell_backward/r1/p2", "task": "rg/spe')  # As if killed mid-write.

    resumed = _launch(tmp_path, "resumed")
    stdout, _ = resumed.communicate(timeout=900)
    assert resumed.returncode == 0, stdout[-3000:]
    rows = _rows(tmp_path, "resumed")
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)) == len(expected) and set(ids) == set(expected)
    assert [r["id"] for r in partial] == ids[: len(partial)]  # What was written before the kill stays.
    for r in rows:
        want = expected[r["id"]]
        assert (r["completion"], r["reason"], r["filters"]) == (want["completion"], want["reason"], want["filters"])
        assert r["messages"] == want["messages"]
    assert "rejected:valid_edit" in stdout
