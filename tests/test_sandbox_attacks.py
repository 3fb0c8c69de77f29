"""Adversarial harnesses, each run in a pool that is running normal jobs at the same time.

Every test checks that the normal jobs came back correct, that no fork server died or was
replaced, and that the pool still serves afterwards.

DANGER: an attack that signals other processes (kill(-1, 9), kill(getppid(), 9)) or forks would end
the whole test run, the session and CI if it ran unconfined as root. Such attacks run only after
`require_contained` has checked, with a probe job in the same pool, that jobs live in their own pid
namespace with no capabilities and under the seccomp filter; otherwise the test is skipped with the
reason. The attack code also re-checks this itself and refuses to act if it does not hold.
"""

import dataclasses
import json
import os
import socket
import time

import pytest
from reasoning_gym.games.n_queens import NQueensDataset

from hljax.tasks.formats import FORMATS
from hljax.tasks.jobs import make_jobs, make_scorer
from hljax.tasks.reasoning_gym import RGTaskConfig, ReasoningGymTask
from hljax.tasks.splits import SplitConfig
from sandbox.config import SandboxConfig
from sandbox.pool import SandboxPool
from sandbox.results import IsolatedScorer, Job, ScorerSpec
from tests._sandbox_fakes import EchoGenerator
from sandbox.isolation import bwrap_path as _bwrap_path

pytestmark = pytest.mark.skipif(_bwrap_path() is None, reason="bwrap not installed (Debian package bubblewrap)")

SECRET = "hljax-test-secret-7f3a"
TAIL = 4096
CONFIG = SandboxConfig(timeout_s=2.0, workers=2, slots_per_worker=3, memory_bytes=256 << 20, output_tail_bytes=TAIL)
NORMAL = "import time\ndef solve(question, solver):\n    time.sleep(0.3)\n    return solver.generate(question)\n"
OWN_PIDNS = os.readlink("/proc/self/ns/pid")

PROBE = """
import json, os
def solve(question, solver):
    fields = dict(l.split(':', 1) for l in open('/proc/self/status').read().splitlines() if ':' in l)
    return json.dumps({'pidns': os.readlink('/proc/self/ns/pid'), 'uid': os.getuid(),
                       'capeff': fields['CapEff'].strip(), 'seccomp': fields['Seccomp'].strip()})
"""

# Prepended to every attack that signals or forks: the job checks its own confinement and refuses
# to act unless it is in another pid namespace (given as the question), capability-less, filtered.
GUARD = """
import os
def confined(outer_pidns):
    fields = dict(l.split(':', 1) for l in open('/proc/self/status').read().splitlines() if ':' in l)
    return (os.readlink('/proc/self/ns/pid') != outer_pidns and int(fields['CapEff'], 16) == 0
            and fields['Seccomp'].strip() == '2')
"""


@pytest.fixture(scope="module")
def pool():
    os.environ["HLJAX_TEST_SECRET"] = SECRET  # In the supervisor's environment: must not reach jobs.
    try:
        with SandboxPool(CONFIG, EchoGenerator()) as p:
            yield p
    finally:
        del os.environ["HLJAX_TEST_SECRET"]


def probe(pool) -> dict:
    (r,) = pool.run([Job(PROBE, "probe")])
    assert r.status == "ok", r
    return json.loads(r.answer)


def require_contained(pool) -> None:
    """Skip (with the reason) unless jobs are verifiably unable to signal anything outside."""
    if pool.config.isolation != "bwrap":
        pytest.skip("signal and fork attacks need bubblewrap's pid namespace; this pool runs rlimits_only")
    info = probe(pool)
    if info["pidns"] == OWN_PIDNS:
        pytest.skip(f"jobs share the test's pid namespace {OWN_PIDNS}: refusing to run a signal attack")
    if info["uid"] == 0 and int(info["capeff"], 16) != 0:
        pytest.skip(f"jobs run as root with capabilities {info['capeff']}: refusing to run a signal attack")
    if info["seccomp"] != "2":
        pytest.skip(f"jobs are not under a seccomp filter (Seccomp: {info['seccomp']}): refusing to run")


KILL_BODY = (
    "    try:\n"
    "        os.kill({target}, 9)\n"
    "    except OSError as e:\n"
    "        return f'refused errno {{e.errno}}'\n"
    "    return 'sent'\n"
)


def guarded(body: str) -> str:
    """Attack code that does nothing unless `confined(question)` holds."""
    return GUARD + "\ndef solve(question, solver):\n    if not confined(question):\n        return 'REFUSED'\n" + body


def run_among_normals(pool, code: str, question: str = "attack", tools=None):
    """Run `code` between normal jobs; check them and the pool; return the attack's result."""
    normals = [Job(NORMAL, f"n{i}", reference=f"echo:n{i}", tag=f"n{i}") for i in range(4)]
    workers = pool.worker_pids
    attack = Job(code, question, tag="attack", tools=tools)
    results = pool.run(normals[:2] + [attack] + normals[2:], lambda a, j: a == j.reference)
    assert [(r.tag, r.status, r.score) for r in results if r.tag != "attack"] == [
        (f"n{i}", "ok", 1.0) for i in range(4)
    ]
    assert pool.worker_pids == workers, "a fork server died or was replaced"
    (after,) = pool.run([Job(NORMAL, "after", reference="echo:after")], lambda a, j: a == j.reference)
    assert after.score == 1.0
    assert pool.worker_pids == workers, "a fork server died or was replaced"
    return results[2]


def test_jobs_are_contained(pool):
    info = probe(pool)
    assert info["pidns"] != OWN_PIDNS
    assert int(info["capeff"], 16) == 0
    assert info["seccomp"] == "2"


def test_infinite_loop(pool):
    r = run_among_normals(pool, "def solve(q, s):\n    while True:\n        pass\n")
    assert r.status == "timeout" and r.run_s >= 2.0


def test_loop_that_catches_base_exception(pool):
    code = (
        "def solve(q, s):\n"
        "    while True:\n"
        "        try:\n"
        "            while True:\n"
        "                pass\n"
        "        except BaseException:\n"
        "            pass\n"
    )
    assert run_among_normals(pool, code).status == "timeout"


def test_sleep_forever(pool):
    r = run_among_normals(pool, "import time\ndef solve(q, s):\n    time.sleep(10**6)\n")
    assert r.status == "timeout" and "deadline" in r.reason


def test_memory_bomb(pool):
    code = (
        "import resource\n"
        "def solve(q, s):\n"
        "    try:\n"
        "        resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY,) * 2)\n"
        "    except (OSError, ValueError):\n"
        "        pass\n"
        "    hog = []\n"
        "    while True:\n"
        "        hog.append(bytearray(32 << 20))\n"
    )
    r = run_among_normals(pool, code)
    assert r.status == "error" and r.error.type == "MemoryError"


def test_fork_bomb(pool):
    require_contained(pool)
    code = guarded("    while True:\n        os.fork()\n")
    r = run_among_normals(pool, code, question=OWN_PIDNS)
    assert r.status == "error" and r.error.type == "PermissionError"


def test_subprocess_and_multiprocessing_fail(pool):
    require_contained(pool)
    body = (
        "    import subprocess, multiprocessing\n"
        "    out = []\n"
        "    starts = (lambda: subprocess.run(['/bin/true']), lambda: multiprocessing.Process(target=print).start())\n"
        "    for start in starts:\n"
        "        try:\n"
        "            start()\n"
        "            out.append('started')\n"
        "        except OSError as e:\n"
        "            out.append(type(e).__name__)\n"
        "    return ' '.join(out)\n"
    )
    r = run_among_normals(pool, guarded(body), question=OWN_PIDNS)
    assert r.answer == "PermissionError PermissionError"


def test_thread_spray(pool):
    code = (
        "import threading, time\n"
        "def solve(q, s):\n"
        "    n = 0\n"
        "    try:\n"
        "        while True:\n"
        "            threading.Thread(target=time.sleep, args=(1000,), daemon=True).start()\n"
        "            n += 1\n"
        "    except RuntimeError:\n"
        "        return str(n)\n"
    )
    r = run_among_normals(pool, code)
    # 8 MiB stacks under a 256 MiB address space: a few dozen threads at most.
    assert r.status == "ok" and 0 < int(r.answer) < 64


def test_200_mb_of_stdout(pool):
    code = (
        "import sys\n"
        "def solve(q, s):\n"
        "    chunk = 'x' * (1 << 20)\n"
        "    for _ in range(200):\n"
        "        sys.stdout.write(chunk)\n"
        "    return 'done'\n"
    )
    r = run_among_normals(pool, code)
    assert r.status == "ok" and r.answer == "done"
    assert r.stdout_bytes == 200 << 20 and r.stdout_tail == "x" * TAIL


def test_sys_exit(pool):
    r = run_among_normals(pool, "import sys\ndef solve(q, s):\n    sys.exit(0)\n")
    assert r.status == "error" and r.error.type == "SystemExit"


def test_os_exit(pool):
    r = run_among_normals(pool, "import os\ndef solve(q, s):\n    os._exit(0)\n")
    assert r.status == "crashed" and r.reason == "exited with status 0 without sending a result"


def test_kill_parent(pool):
    require_contained(pool)
    body = KILL_BODY.format(target="os.getppid()")
    assert run_among_normals(pool, guarded(body), question=OWN_PIDNS).answer == "refused errno 1"


def test_kill_everything(pool):
    require_contained(pool)
    body = KILL_BODY.format(target="-1")
    assert run_among_normals(pool, guarded(body), question=OWN_PIDNS).answer == "refused errno 1"


def test_socket_to_loopback_and_outside(pool):
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    port = listener.getsockname()[1]
    code = (
        "import socket\n"
        "def attempt(family, kind, addr):\n"
        "    try:\n"
        "        s = socket.socket(family, kind)\n"
        "    except OSError as e:\n"
        "        return f'socket errno {e.errno}'\n"
        "    s.settimeout(1)\n"
        "    try:\n"
        "        s.connect(addr)\n"
        "        return 'connected'\n"
        "    except OSError as e:\n"
        "        return f'connect errno {e.errno}'\n"
        "def solve(q, s):\n"
        f"    tries = [(socket.AF_INET, socket.SOCK_STREAM, ('127.0.0.1', {port})),\n"
        "             (socket.AF_INET, socket.SOCK_STREAM, ('192.0.2.1', 80)),\n"
        "             (socket.AF_INET, socket.SOCK_DGRAM, ('192.0.2.1', 53)),\n"
        "             (socket.AF_INET6, socket.SOCK_STREAM, ('::1', 80)),\n"
        "             (socket.AF_NETLINK, socket.SOCK_RAW, (0, 0)),\n"
        "             (socket.AF_UNIX, socket.SOCK_STREAM, '\\0abstract')]\n"
        "    return ','.join(attempt(*t) for t in tries)\n"
    )
    r = run_among_normals(pool, code)
    assert r.answer == ",".join(["socket errno 1"] * 6)
    with pytest.raises(BlockingIOError):
        listener.accept()  # Nothing ever reached the host's loopback.
    listener.close()


def test_writing_outside_the_work_dir(pool, tmp_path):
    host_file = tmp_path / "pwned"  # A host path: absent from the sandbox, so unreachable.
    targets = ["/etc/pwned", "/usr/pwned", "/pwned", "/opt/hljax/sandbox/worker.py", "/root/pwned", str(host_file)]
    code = (
        "def solve(q, s):\n"
        "    out = []\n"
        f"    for path in {targets!r}:\n"
        "        try:\n"
        "            open(path, 'a').write('x')\n"
        "            out.append('wrote')\n"
        "        except OSError as e:\n"
        "            out.append(type(e).__name__)\n"
        "    open('mine.txt', 'w').write('ok')\n"
        "    try:\n"
        "        open('big.bin', 'wb').write(b'0' * (32 << 20))\n"
        "    except OSError as e:\n"
        "        out.append(e.strerror)\n"
        "    return ','.join(out)\n"
    )
    r = run_among_normals(pool, code)
    # /etc does not exist in the sandbox; /usr, / and the package are read-only; /root is absent.
    assert r.answer == "FileNotFoundError,OSError,OSError,OSError,OSError,FileNotFoundError,File too large"
    assert not host_file.exists()


def test_reading_secrets(pool):
    code = (
        "import os\n"
        "def solve(q, s):\n"
        "    found = [repr(dict(os.environ))]\n"
        "    paths = ['/etc/shadow', '/etc/passwd', '/root/.bash_history', '/proc/1/environ', '/proc/self/environ']\n"
        "    for path in paths:\n"
        "        try:\n"
        "            found.append(path + '=' + open(path, 'rb').read().decode('latin-1'))\n"
        "        except OSError as e:\n"
        "            found.append(path + ':' + type(e).__name__)\n"
        "    return '\\n'.join(found)\n"
    )
    r = run_among_normals(pool, code)
    assert SECRET not in r.answer
    lines = r.answer.split("\n")
    assert lines[1:4] == [f"{p}:FileNotFoundError" for p in ("/etc/shadow", "/etc/passwd", "/root/.bash_history")]
    assert eval(lines[0]) == {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp", "PWD": "/tmp"}  # noqa: S307


def test_closing_the_result_pipe(pool):
    r = run_among_normals(pool, "import os\ndef solve(q, s):\n    os.close(4)\n    return 'x'\n")
    assert r.status == "crashed" and r.reason == "exited with status 0 without sending a result"


def test_garbage_on_the_job_channel(pool):
    code = "import os\ndef solve(q, s):\n    os.write(4, b'\\x00\\x00\\x00\\x05notjs')\n    return 'x'\n"
    r = run_among_normals(pool, code)
    assert r.status == "crashed" and r.reason.startswith("protocol violation: not UTF-8 JSON")


def test_oversized_frame_on_the_job_channel(pool):
    code = (
        "import os, time\n"
        "def solve(q, s):\n"
        "    os.write(4, b'\\xff\\xff\\xff\\xff')  # A 4 GiB frame header.\n"
        "    time.sleep(1)\n"
        "    return 'x'\n"
    )
    r = run_among_normals(pool, code)
    assert r.status == "crashed" and "exceeds the limit" in r.reason


def test_deeply_nested_json_on_the_job_channel(pool):
    code = (
        "import os\n"
        "def solve(q, s):\n"
        "    body = b'[' * 200000 + b']' * 200000\n"
        "    os.write(4, len(body).to_bytes(4, 'big') + body)\n"
        "    return 'x'\n"
    )
    r = run_among_normals(pool, code)
    assert r.status == "crashed" and r.reason.startswith("protocol violation: not UTF-8 JSON: RecursionError")


def test_ctypes_syscalls(pool):
    require_contained(pool)
    body = (
        "    import ctypes\n"
        "    libc = ctypes.CDLL(None, use_errno=True)\n"
        "    out = []\n"
        "    calls = [('kill', lambda: libc.kill(-1, 9)), ('fork', lambda: libc.syscall(57)),\n"
        "             ('clone', lambda: libc.syscall(56, 17, 0, 0, 0, 0)),\n"
        "             ('ptrace', lambda: libc.ptrace(16, 1, 0, 0))]\n"
        "    for name, call in calls:\n"
        "        rc = call()\n"
        "        out.append(f'{name}={rc}/{ctypes.get_errno()}')\n"
        "    return ' '.join(out)\n"
    )
    r = run_among_normals(pool, guarded(body), question=OWN_PIDNS)
    assert r.answer == "kill=-1/1 fork=-1/1 clone=-1/1 ptrace=-1/1"


def test_ctypes_segfault(pool):
    r = run_among_normals(pool, "import ctypes\ndef solve(q, s):\n    return ctypes.string_at(0)\n")
    assert r.status == "crashed" and r.reason == "killed by signal SIGSEGV"


# ----- answers attacking the scorer -------------------------------------------------------------------

N_QUEENS_SCORER = NQueensDataset.score_answer  # As reasoning-gym defines it, before any test runs.


def answering(text: str) -> str:
    return f"def solve(question, solver):\n    return {text!r}\n"


def test_n_queens_answers_cannot_rewrite_forge_or_read_the_scorer(pool):
    """reasoning-gym's n_queens scorer eval()s answers that are not a listed solution."""
    task = ReasoningGymTask(RGTaskConfig("n_queens", splits=SplitConfig(seed=0, feedback_size=2)))
    q = task.feedback_round(0)[0]
    fmt, reference = FORMATS[q.payload.format], q.payload.entry["answer"]
    rewrite = 'setattr(type(self), "score_answer", lambda s, a, e: 1.0)'
    forge = "__import__('os').write(4, b'{\"value\": 1.0, \"error\": \"\"}') and __import__('os')._exit(0)"
    # Reads the reference out of the scorer's own frame and reports it as a scorer error.
    read = ("__import__('os').write(4, __import__('json').dumps({'value': 0.0, 'error': "
            "str(__import__('sys')._getframe(1).f_locals['entry']['answer'])}).encode()) and __import__('os')._exit(0)")
    codes = [answering(q.answer), answering(fmt.render(rewrite)), answering(fmt.render(forge)),
             answering(fmt.render(read)), answering(q.answer)]  # fmt: skip
    workers = pool.worker_pids
    honest, rewriter, forger, reader, honest2 = pool.run(
        [job for code in codes for job in make_jobs(task, code, [q])], make_scorer(task, [q]))
    assert [r.status for r in (honest, rewriter, forger, reader, honest2)] == ["ok"] * 5
    assert (honest.score, honest2.score) == (1.0, 1.0)
    assert (rewriter.score, forger.score, reader.score) == (0.0, 0.0, 0.0)
    # The scorer was not rewritten: a wrong answer that follows still scores 0, a right one 1.
    wrong, right = pool.run([*make_jobs(task, answering(fmt.render("[['Q']]")), [q]),
                             *make_jobs(task, answering(q.answer), [q])], make_scorer(task, [q]))
    assert (wrong.score, right.score) == (0.0, 1.0)
    assert NQueensDataset.score_answer is N_QUEENS_SCORER, "the trainer's scorer class was rewritten"
    assert task.score(fmt.render("[['Q']]"), q).value == 0.0
    for r in (rewriter, forger, reader, wrong):
        for text in (r.answer, r.scorer_error, r.reason, r.stdout_tail, r.stderr_tail):
            assert reference not in text and repr(reference)[1:-1] not in text, text
    assert pool.worker_pids == workers


def test_a_hanging_or_dying_scorer_scores_zero_and_the_batch_is_scored():
    config = SandboxConfig(workers=1, scorer_timeout_s=1.0, scorer_parallel=2, scorer_packages=("hljax", "tests"))
    answers = ["hang", "right", "spin", "wrong", "die", "right"]
    jobs = [Job(answering(a), "q", tag=f"q{i}") for i, a in enumerate(answers)]
    scorer = IsolatedScorer(ScorerSpec("tests._scorer_fakes:misbehaving_scorer"), {j.tag: "right" for j in jobs})
    with SandboxPool(config, EchoGenerator()) as p:
        p.run([jobs[1]], scorer)  # Starts the scorer process.
        scorer_pid = p.scorer_pid
        started = time.monotonic()
        results = p.run(jobs, scorer)
        elapsed = time.monotonic() - started
        assert [r.status for r in results] == ["ok"] * 6
        assert [r.score for r in results] == [0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
        for i in (0, 2):
            assert "ran past 1.0 s" in results[i].scorer_error
        assert "signal 9" in results[4].scorer_error
        assert results[1].scorer_error == results[3].scorer_error == ""
        assert elapsed < 10, elapsed  # Killed at the scorer timeout, the two in parallel.
        (again,) = p.run([jobs[1]], scorer)
        assert again.score == 1.0 and p.scorer_pid == scorer_pid, "the scorer process was replaced"


def test_scorer_audit_covers_every_listed_family():
    from configs import rg_families

    listed = set(rg_families.SFT + rg_families.RL + rg_families.HELDOUT)
    assert set(rg_families.SCORER_AUDIT) == listed
    evaluating = {f for f, what in rg_families.SCORER_AUDIT.items() if what.startswith("EVAL")}
    assert evaluating == {"n_queens"}


@pytest.mark.parametrize(
    "code, check",
    [
        ("def solve(q, s):\n    return 'a\\ud800b\\udfff'\n", lambda r: r.answer == "a\ufffdb\ufffd"),
        ("def solve(q, s):\n    return s.generate('x\\udc80')\n", lambda r: r.answer == "echo:x\ufffd"),
        ("def solve(q, s):\n    raise ValueError('\\ud800')\n", lambda r: r.error.message == "\ufffd"),
    ],
)
def test_lone_surrogates_are_replaced_at_the_boundary(pool, code, check):
    r = run_among_normals(pool, code)
    assert r.status in ("ok", "error") and check(r), r
    for text in (r.answer or "", r.error.message if r.error else "", r.error.traceback if r.error else ""):
        text.encode("utf-8")  # What reports, logs and the Generator do with them.


# ----- floods on the job channel (issue 19, items 4 and 5) ----------------------------------------------


class PeakRss:
    """Samples this process's resident size in a thread; `growth` is the peak over the start, in bytes."""

    def __init__(self):
        import threading

        self._stop = threading.Event()
        self.start = self.peak = self._rss()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    @staticmethod
    def _rss() -> int:
        return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _sample(self):
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self._rss())

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    @property
    def growth(self) -> int:
        return self.peak - self.start


def test_message_flood_does_not_stall_the_supervisor_or_its_deadlines(pool):
    # Tool calls written as fast as the pipe takes them for 4 s (twice the deadline); a thread
    # drains the replies so that only the flood itself is measured.
    code = (
        "import json, os, threading, time\n"
        "def drain():\n"
        "    while os.read(3, 1 << 16):\n"
        "        pass\n"
        "def solve(q, s):\n"
        "    threading.Thread(target=drain, daemon=True).start()\n"
        "    body = json.dumps({'t': 'tool', 'name': 'nope', 'args': [], 'kwargs': {}}).encode()\n"
        "    frames = (len(body).to_bytes(4, 'big') + body) * 2000\n"
        "    end = time.monotonic() + 4\n"
        "    while time.monotonic() < end:\n"
        "        os.write(4, frames)\n"
        "    return 'done'\n"
    )
    started = time.monotonic()
    r = run_among_normals(pool, code)
    elapsed = time.monotonic() - started
    assert r.status == "timeout", r
    assert r.run_s < CONFIG.timeout_s + 0.5, r.run_s
    assert elapsed < CONFIG.timeout_s + 2.5, elapsed  # The after-run included; the flood lasted 4 s.


def test_refusals_do_not_echo_requests_that_are_never_read(pool):
    # 1 MiB tool names and sampling keys, replies never read: refusals must not echo them.
    code = (
        "import json, os, time\n"
        "def frame(msg):\n"
        "    body = json.dumps(msg).encode()\n"
        "    return len(body).to_bytes(4, 'big') + body\n"
        "def solve(q, s):\n"
        "    big = 'x' * (1 << 20)\n"
        "    frames = (frame({'t': 'tool', 'name': big, 'args': [], 'kwargs': {}})\n"
        "              + frame({'t': 'generate', 'prompts': ['p'], 'sampling': {big: 1}}))\n"
        "    end = time.monotonic() + 4\n"
        "    while time.monotonic() < end:\n"
        "        os.write(4, frames)\n"
        "    return 'done'\n"
    )
    with PeakRss() as rss:
        r = run_among_normals(pool, code)
    assert r.status in ("timeout", "crashed"), r
    assert rss.growth < 3 * CONFIG.max_message_bytes + (32 << 20), rss.growth


def test_replies_left_unread_past_the_bound_are_a_violation(pool):
    # A tool with 1 MiB results, called without reading them: the supervisor holds at most
    # 2 x max_message_bytes of replies for the job, then ends it.
    code = (
        "import json, os, time\n"
        "def solve(q, s):\n"
        "    body = json.dumps({'t': 'tool', 'name': 'big', 'args': [], 'kwargs': {}}).encode()\n"
        "    for _ in range(64):\n"
        "        os.write(4, len(body).to_bytes(4, 'big') + body)\n"
        "    time.sleep(10)\n"
    )
    with PeakRss() as rss:
        r = run_among_normals(pool, code, tools={"big": lambda: "x" * (1 << 20)})
    assert r.status == "crashed" and "does not read its replies" in r.reason, r
    assert r.run_s < 1.5, r.run_s
    assert rss.growth < 3 * CONFIG.max_message_bytes + (32 << 20), rss.growth


def test_cpu_burnt_while_solver_calls_pause_the_clock_is_bounded_by_the_wall_budget():
    # The deadline clock pauses while a solver call is pending; a thread spinning meanwhile is held
    # by the wall budget (brokered time included), not only by the CPU limit.
    config = dataclasses.replace(CONFIG, wall_timeout_s=3.0)
    code = (
        "import threading\n"
        "def spin():\n"
        "    while True:\n"
        "        pass\n"
        "def solve(q, s):\n"
        "    threading.Thread(target=spin, daemon=True).start()\n"
        "    for i in range(16):\n"
        "        s.generate(f'call {i}')\n"
        "    return 'done'\n"
    )
    with SandboxPool(config, EchoGenerator(delay_s=0.6)) as p:
        r = run_among_normals(p, code)
    assert r.status == "timeout" and "wall budget" in r.reason, r
    assert r.run_s < config.timeout_s, r.run_s  # Its own clock alone would not have stopped it.


# ----- privileges and kernel knobs (issue 19, items 2, 3, 8) --------------------------------------------


def test_jobs_are_not_root_and_proc_sys_is_read_only(pool):
    # Opens for writing only, never writes: on an unconfined machine these knobs are the host's.
    knobs = ["/proc/sys/kernel/core_pattern", "/proc/sys/vm/overcommit_memory", "/proc/sys/vm/drop_caches"]
    code = (
        "import errno, json, os\n"
        "def solve(q, s):\n"
        "    opened = []\n"
        f"    for path in {knobs!r}:\n"
        "        try:\n"
        "            os.close(os.open(path, os.O_WRONLY))\n"
        "            opened.append('opened')\n"
        "        except OSError as e:\n"
        "            opened.append(errno.errorcode[e.errno])\n"
        "    return json.dumps({'uid': os.getuid(), 'gid': os.getgid(), 'opened': opened})\n"
    )
    r = run_among_normals(pool, code)
    info = json.loads(r.answer)
    assert (info["uid"], info["gid"]) == (65534, 65534), info
    assert info["opened"] == ["EROFS"] * 3, info


def test_no_memory_outside_the_job_limit_through_dev_or_memfd(pool):
    # 20 files of 15 MiB (RLIMIT_FSIZE caps each file, not their number): 300 MiB, past the job's
    # 256 MiB address space, held in /dev/shm, in /dev itself, or in memfds.
    code = (
        "import errno, os\n"
        "def hold(create):\n"
        "    chunk, fds = b'x' * (15 << 20), []\n"
        "    try:\n"
        "        for i in range(20):\n"
        "            fds.append(create(i))\n"
        "            os.write(fds[-1], chunk)\n"
        "        return f'held {15 * len(fds)} MiB'\n"
        "    except OSError as e:\n"
        "        return f'{errno.errorcode[e.errno]} after {15 * max(0, len(fds) - 1)} MiB'\n"
        "    finally:\n"
        "        for fd in fds:\n"
        "            os.close(fd)\n"
        "def solve(q, s):\n"
        "    flags = os.O_WRONLY | os.O_CREAT\n"
        "    return ','.join([hold(lambda i: os.open(f'/dev/shm/hog{i}', flags, 0o600)),\n"
        "                     hold(lambda i: os.open(f'/dev/hog{i}', flags, 0o600)),\n"
        "                     hold(lambda i: os.memfd_create(f'hog{i}'))])\n"
    )
    r = run_among_normals(pool, code)
    assert r.answer == "EROFS after 0 MiB,EROFS after 0 MiB,EPERM after 0 MiB", r


# ----- jobs sabotaging their fork server's other jobs (issue 19, item 6) ---------------------------------


def test_squatted_work_dirs_and_deep_trees_do_not_break_other_jobs_or_the_fork_server(pool):
    # Work dirs were /tmp/jobs/<job number>: a job could create the next ones (their mkdir then
    # failed), and 1,500 nested dirs made the fork server's cleanup raise RecursionError.
    code = (
        "import os\n"
        "def solve(q, s):\n"
        "    here = os.getcwd()\n"
        "    base, name = os.path.split(here)\n"
        "    k = int(name) if name.isdigit() else 0\n"
        "    for i in range(k + 1, k + 200):\n"
        "        try:\n"
        "            os.mkdir(f'{base}/{i}')\n"
        "        except OSError:\n"
        "            pass\n"
        "    for _ in range(1500):\n"
        "        os.mkdir('d')\n"
        "        os.chdir('d')\n"
        "    open('f', 'w').write('x')\n"
        "    return 'planted'\n"
    )
    assert run_among_normals(pool, code).answer == "planted"
    results = pool.run([Job(NORMAL, f"m{i}", reference=f"echo:m{i}") for i in range(12)], lambda a, j: a == j.reference)
    assert [r.score for r in results] == [1.0] * 12, results
