"""Shared by the sandbox attack tests: a pool running normal jobs beside each attack, and the guard
that keeps signal and fork attacks from running anywhere they could reach the machine.

DANGER: an attack that signals other processes (kill(-1, 9), kill(getppid(), 9)) or forks would end
the whole test run, the session and CI if it ran unconfined as root. Such attacks run only after
`require_contained` has checked, with a probe job in the same pool, that jobs live in their own pid
namespace with no capabilities and under the seccomp filter; otherwise the test is skipped with the
reason. The attack code also re-checks this itself and refuses to act if it does not hold.
"""

import json
import os

import pytest

from sandbox.config import SandboxConfig
from sandbox.isolation import bwrap_path
from sandbox.pool import SandboxPool
from sandbox.results import Job
from tests._sandbox_fakes import EchoGenerator

needs_bwrap = pytest.mark.skipif(bwrap_path() is None, reason="bwrap not installed (Debian package bubblewrap)")

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
    """Module-scoped: every attack of a module runs in one pool, beside normal jobs."""
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

