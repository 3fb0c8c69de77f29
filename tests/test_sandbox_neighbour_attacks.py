"""Issue 36: no job can slow the trusted side, take a fork server away, or make a neighbour fail.

Each attack runs from harness code alone beside normal jobs, and each test checks the normal jobs'
results. Pools here are small (one or two fork servers) so that the attack shares its fork server,
and its cores, with the jobs it could hurt.
"""

import collections
import dataclasses
import importlib.util
import logging
import os
import platform
import signal
import threading
import time

import pytest

from sandbox import isolation, seccomp
from sandbox.config import SolverConfig
from sandbox.pool import SandboxPool
from sandbox.scoring import ScorerProcess
from sandbox.results import Job
from tests._sandbox_attack_kit import (  # noqa: F401 - `pool` is a fixture.
    CONFIG, NORMAL, OWN_PIDNS, guarded, needs_bwrap, pool, probe, require_contained,
)
from tests._sandbox_fakes import EchoGenerator

pytestmark = needs_bwrap


def exact(answer, job):
    return answer == job.reference


def normals(code: str, n: int, prefix: str = "n") -> list[Job]:
    return [Job(code, f"{prefix}{i}", reference=f"echo:{prefix}{i}", tag=f"{prefix}{i}") for i in range(n)]


def scores(results, prefix: str = "n") -> list:
    return [(r.tag, r.status, r.score) for r in results if r.tag.startswith(prefix)]


# ----- item 1: leases, and the other fcntl/ioctl paths to block or signal other processes -----------------

# A stdlib module no fork server preloads: the normal jobs import it while the attack holds it.
LEASED = importlib.util.find_spec("colorsys").cached
IMPORTER = (
    "import time\ndef solve(question, solver):\n    time.sleep(0.3)\n    import colorsys\n    return 'echo:' + question\n"
)


# Guarded (`guarded(LEASE_BODY)`): every lease, fcntl and ioctl path to block or signal others, each
# call's errno in the answer, held for 1 s while the normal jobs import LEASED. Also bench/sandbox_attacks.py.
LEASE_BODY = f"""
    import ctypes, errno, fcntl, signal, time
    signal.signal(signal.SIGIO, signal.SIG_IGN)  # A lease break would otherwise end the job.
    libc = ctypes.CDLL(None, use_errno=True)
    rival = os.getppid()  # The fork server: a process of the same uid, like any rival job.
    r, w = os.pipe()
    leased, here = os.open({LEASED!r}, os.O_RDONLY), os.open('.', os.O_RDONLY)
    owner = ctypes.c_int(rival)
    def raw(nr, *args):
        res = libc.syscall(ctypes.c_long(nr), *map(ctypes.c_long, args))
        if res < 0:
            raise OSError(ctypes.get_errno(), 'refused')
    calls = [('lease', lambda: fcntl.fcntl(leased, fcntl.F_SETLEASE, fcntl.F_WRLCK)),
             ('lease_high_bits', lambda: raw(72, leased, (1 << 32) | 1024, fcntl.F_WRLCK)),
             ('notify', lambda: fcntl.fcntl(here, fcntl.F_NOTIFY, fcntl.DN_MODIFY | fcntl.DN_MULTISHOT)),
             ('setown_high_bits', lambda: raw(72, r, (1 << 32) | fcntl.F_SETOWN, rival)),
             ('pipe_size', lambda: fcntl.fcntl(r, fcntl.F_SETPIPE_SZ, 1 << 20)),
             ('fiosetown', lambda: raw(16, r, 0x8901, ctypes.addressof(owner))),
             ('siocspgrp', lambda: raw(16, r, 0x8902, ctypes.addressof(owner))),
             ('sync', lambda: raw(162)), ('syncfs', lambda: raw(306, leased)),
             ('fadvise', lambda: os.posix_fadvise(leased, 0, 0, os.POSIX_FADV_DONTNEED)),
             ('shmget', lambda: raw(29, 0, 1 << 20, 0o1600)), ('inotify', lambda: raw(294, 0))]
    out = []
    for name, call in calls:
        try:
            call()
            out.append(f'{{name}}=ok')
        except OSError as e:
            out.append(f'{{name}}={{errno.errorcode[e.errno]}}')
    time.sleep(1.0)  # Holding whatever it got while the normal jobs import the module.
    return ' '.join(out)
"""


def _open_stalls(path: str, stop: threading.Event, out: list) -> None:
    """The trusted side's view: open `path` every 20 ms, keep the longest wait."""
    while not stop.wait(0.02):
        start = time.monotonic()
        with open(path, "rb"):
            pass
        out[0] = max(out[0], time.monotonic() - start)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="raw syscall numbers are x86_64's")
def test_a_job_can_neither_lease_a_file_nor_make_the_kernel_signal_or_block_others(pool):
    # When jobs were host root underneath, a write lease on a root-owned file of the read-only binds made
    # every other open() of it, the supervisor's and a fresh host python's included, wait 10 s for the
    # job's death. They now run as an unprivileged host uid (item 8), which the kernel refuses a lease on
    # a file it does not own; the filter refuses it first, for HLJAX_SANDBOX_HOST_UID=caller and bare
    # pools. The raw syscalls set the upper half of the 32-bit command, which the filter once compared too.
    require_contained(pool)
    body = LEASE_BODY
    stop, stall = threading.Event(), [0.0]
    watcher = threading.Thread(target=_open_stalls, args=(LEASED, stop, stall))
    watcher.start()
    workers = pool.worker_pids
    try:
        results = pool.run([Job(guarded(body), OWN_PIDNS, tag="attack")] + normals(IMPORTER, 5), exact)
    finally:
        stop.set()
        watcher.join()
    assert scores(results) == [(f"n{i}", "ok", 1.0) for i in range(5)]
    names = ["lease", "lease_high_bits", "notify", "setown_high_bits", "pipe_size", "fiosetown", "siocspgrp",
             "sync", "syncfs", "fadvise", "shmget", "inotify"]
    assert results[0].answer == " ".join(f"{n}=EPERM" for n in names), results[0]
    assert stall[0] < 0.5, f"an open() of {LEASED} on the trusted side waited {stall[0]:.2f}s"
    assert pool.worker_pids == workers


# ----- item 2: refused and malformed solver calls cost their own job only --------------------------------

CALLER = (
    "def solve(question, solver):\n"
    "    return ' '.join(solver.generate(f'{question}-{k}') for k in range(4))\n"
)
SPAMMER = """
from sandbox.runner import BudgetExceeded, SolverError
def solve(question, solver):
    out = collections.Counter()
    bad = [dict(seed=2**40), dict(temperature=float('nan')), dict(top_k=2**40), dict(stop=[''] * 100)]
    for i in range(40):
        try:
            solver.generate(f'POISON {i}', **(bad[i % 4] if i % 2 else {}))
            out['served'] += 1
        except BudgetExceeded:
            out['budget'] += 1
        except SolverError:
            out['refused'] += 1
    return f"{out['refused']} {out['budget']} {out['served']}"
""".replace("from sandbox.runner", "import collections\nfrom sandbox.runner")


def _resent(gen: EchoGenerator, prefix: str) -> int:
    """How many times a normal job's prompt went to the Generator again (a batch split for someone else)."""
    sent = collections.Counter(p for request in gen.prompts for p in request if p.startswith(prefix))
    return sum(n - 1 for n in sent.values())


def test_refused_and_malformed_solver_calls_are_their_jobs_errors_and_split_no_other_batch():
    # Refused calls were free and split every batch they landed in: up to 4x the Generator requests and
    # 3x the wall time for the other jobs.
    gen = EchoGenerator(refuse="POISON", delay_s=0.01)
    solver = SolverConfig(batch_window_s=0.02)
    with SandboxPool(dataclasses.replace(CONFIG, workers=1, slots_per_worker=7), gen, solver) as p:
        results = p.run([Job(SPAMMER, "x", tag="attack")] + normals(CALLER, 6), None)
    for r in results[1:]:
        assert r.status == "ok" and r.answer == " ".join(f"echo:{r.tag}-{k}" for k in range(4)), r
    refused, budget, served = map(int, results[0].answer.split())
    # 16 calls of budget: half reach the Generator and are refused, half are refused before it (bad
    # sampling); each costs a call as if served, so the rest are BudgetExceeded.
    assert (refused, budget, served) == (16, 24, 0), results[0].answer
    # Only the first refused call splits a batch (halving it: 6 + 3 + 1 resent at most for 7 calls); the
    # job's later calls go to the Generator alone.
    assert _resent(gen, "n") <= 10, f"normal jobs' prompts were sent {_resent(gen, 'n')} extra times"


def test_a_seed_out_of_range_is_the_jobs_own_error_not_an_infra_error():
    # Through the engine (seeds are uint32 there) seed=2**40 failed the Generator request: the job's own
    # call came back as an infra_error, which drops its whole GRPO group.
    code = (
        "from sandbox.runner import SolverError\n"
        "def solve(question, solver):\n"
        "    try:\n"
        "        solver.generate('hi', seed=2**40)\n"
        "    except SolverError as e:\n"
        "        return f'refused: {e}'\n"
        "    return 'served'\n"
    )
    with SandboxPool(dataclasses.replace(CONFIG, workers=1), EchoGenerator(max_seed=2**32 - 1)) as p:
        (r,) = p.run([Job(code, "q")])
    assert r.status == "ok" and r.answer.startswith("refused: seed must be in [0, 2147483647]"), r


# ----- item 3: a job's exit is reported before any clean-up -----------------------------------------------

DIRS = (
    "import os\n"
    "def solve(question, solver):\n"
    "    i = 0\n"
    "    while True:  # Empty directories until its deadline, then it is killed.\n"
    "        try:\n"
    "            os.mkdir(f'd{i}')\n"
    "        except OSError:\n"
    "            pass\n"
    "        i += 1\n"
)
SLOW = "import time\ndef solve(question, solver):\n    time.sleep(1.0)\n    return 'echo:' + question\n"


def test_a_job_leaving_many_directories_costs_no_neighbour_its_result():
    # The fork server removed a dead job's work dir before it reported the exit: a job that made empty
    # directories until its deadline held it past the kill grace, the fork server was replaced, and the
    # jobs beside the attack came back infra_error.
    config = dataclasses.replace(CONFIG, workers=1, slots_per_worker=4)
    with SandboxPool(config, EchoGenerator()) as p:
        workers = p.worker_pids
        results = p.run([Job(DIRS, "x", tag="attack")] + normals(SLOW, 9), exact)
        assert scores(results) == [(f"n{i}", "ok", 1.0) for i in range(9)]
        assert results[0].status == "timeout"
        assert p.worker_pids == workers, "the fork server was replaced"


# ----- item 4: fork-server replacement in the background, retried until the pool is whole -----------------


def test_a_fork_server_that_will_not_start_is_retried_with_backoff_while_the_others_serve(monkeypatch, caplog):
    # The replacement of a dead fork server was waited for (up to start_timeout_s, the whole supervisor
    # stalled) and never tried again: the pool stayed a fork server short for good.
    config = dataclasses.replace(CONFIG, workers=2, start_timeout_s=1.0)
    with SandboxPool(config, EchoGenerator()) as p:
        real, hangs = isolation.bwrap_launch, [2]

        def launch(*args, **kwargs):  # The next two starts hang: no READY, ever.
            if hangs[0]:
                hangs[0] -= 1
                return isolation.LaunchSpec(argv=("/bin/sleep", "60"), env={})
            return real(*args, **kwargs)

        monkeypatch.setattr(isolation, "bwrap_launch", launch)
        loop_passes = []
        dispatch = p._dispatch
        monkeypatch.setattr(p, "_dispatch", lambda *a: (loop_passes.append(time.monotonic()), dispatch(*a))[1])
        killed_at = time.monotonic()
        os.kill(p.worker_pids[0], signal.SIGKILL)
        with caplog.at_level(logging.WARNING, logger="sandbox.pool"):
            results = p.run(normals(NORMAL, 6), exact)
            assert scores(results) == [(f"n{i}", "ok", 1.0) for i in range(6)]
            assert p.await_capacity(20.0), "the pool did not get its fork servers back"
        back_s = time.monotonic() - killed_at
    stall = max(b - a for a, b in zip(loop_passes, loop_passes[1:]))
    assert stall < 0.5, f"the supervisor loop stalled {stall:.2f}s"
    failures = [r.getMessage() for r in caplog.records if "could not be started" in r.getMessage()]
    assert len(failures) == 2 and "try 2" in failures[1] and "1 of 2 fork servers running" in failures[1], failures
    assert back_s < 10.0


# ----- item 5: bounded decode cost per message, charged to its sender -------------------------------------

DECODE_BOMB = (
    "import json, os\n"
    "def solve(question, solver):\n"
    "    body = b'{\"t\": \"tool\", \"name\": \"x\", \"kwargs\": {}, \"args\": [' + b'[],' * 350000 + b'[]]}'\n"
    "    frame = len(body).to_bytes(4, 'big') + body\n"
    "    for _ in range(40):  # Valid messages, each refused (no such tool) after it was decoded.\n"
    "        os.write(4, frame)\n"
    "    return 'sent'\n"
)
TOOL_USER = (
    "import time\n"
    "def solve(question, solver):\n"
    "    time.sleep(0.2)\n"
    "    return lookup(question)\n"
)


def test_frames_costly_to_decode_are_refused_before_decoding_and_charged_to_their_sender(pool):
    # Each 1 MiB frame of empty lists cost the supervisor ~0.1 s and ~25 MB to decode, and the job could
    # send them for as long as it ran: every other job's charged time grew with it.
    tools = {"lookup": lambda q: f"echo:{q}"}
    jobs = [Job(DECODE_BOMB, "x", tag="attack")] + [dataclasses.replace(j, tools=tools) for j in normals(TOOL_USER, 5)]
    start = time.monotonic()
    results = pool.run(jobs, exact)
    took = time.monotonic() - start
    assert scores(results) == [(f"n{i}", "ok", 1.0) for i in range(5)]
    assert results[0].status == "crashed" and "frame holds over 20000 JSON values" in results[0].reason, results[0]
    assert max(r.run_s for r in results[1:]) < 1.0, [r.run_s for r in results[1:]]
    assert took < 2.0


# ----- item 6: per-job quotas: disk and tasks --------------------------------------------------------------

FILLER = (
    "import os, time\n"
    "def solve(question, solver):\n"
    "    for i in range(64):  # 16 MiB files (RLIMIT_FSIZE) until the disk is full.\n"
    "        try:\n"
    "            with open(f'f{i}', 'wb') as f:\n"
    "                f.write(b'x' * (16 << 20))\n"
    "        except OSError:\n"
    "            break\n"
    "    time.sleep(1.0)  # Holding it while the others write.\n"
    "    return 'full'\n"
)
WRITER = (
    "import time\n"
    "def solve(question, solver):\n"
    "    time.sleep(0.4)\n"
    "    with open('out', 'wb') as f:\n"
    "        f.write(b'y' * (2 << 20))\n"
    "    return 'echo:' + question\n"
)


def test_a_job_filling_its_disk_leaves_its_neighbours_room_to_write():
    # One job filling the fork server's shared 256 MiB work disk made its neighbours' 2 MiB writes fail.
    with SandboxPool(dataclasses.replace(CONFIG, workers=1, slots_per_worker=4), EchoGenerator()) as p:
        results = p.run([Job(FILLER, "x", tag="attack")] + normals(WRITER, 6), exact)
    assert results[0].answer == "full"
    assert scores(results) == [(f"n{i}", "ok", 1.0) for i in range(6)], results


FLOOD = (
    "import threading, time\n"
    "def solve(question, solver):\n"
    "    threading.stack_size(64 << 10)\n"
    "    gate, made = threading.Event(), 0\n"
    "    try:\n"
    "        for _ in range(3000):\n"
    "            threading.Thread(target=gate.wait, daemon=True).start()\n"
    "            made += 1\n"
    "    except RuntimeError:\n"
    "        pass\n"
    "    time.sleep(1.0)  # Holding them while the others start theirs.\n"
    "    gate.set()\n"
    "    return str(made)\n"
)
THREADED = (
    "import concurrent.futures, time\n"
    "def solve(question, solver):\n"
    "    time.sleep(0.3)\n"
    "    with concurrent.futures.ThreadPoolExecutor(8) as ex:\n"
    "        parts = list(ex.map(lambda c: (time.sleep(0.1), c)[1], 'echo:' + question))\n"
    "    return ''.join(parts)\n"
)


def test_a_thread_flood_stops_at_its_own_cap_and_leaves_its_neighbours_threads_and_forks():
    # The fork server's pids cgroup was the only cap: a flood took all of it, its neighbours could start no
    # thread, and the fork server could not fork the jobs queued after it (infra_error).
    from tests.test_sandbox_rival_attacks import _capped_here

    if not _capped_here():
        pytest.skip("root without a writable pids cgroup: no task cap can bind here (the pool warns)")
    # 1 GiB of address space: each thread of the normal jobs reserves a stack and a malloc arena.
    config = dataclasses.replace(CONFIG, workers=1, slots_per_worker=4, max_tasks=64, memory_bytes=1 << 30)
    with SandboxPool(config, EchoGenerator()) as p:
        results = p.run([Job(FLOOD, "x", tag="attack")] + normals(THREADED, 6), exact)
    assert scores(results) == [(f"n{i}", "ok", 1.0) for i in range(6)], results
    assert 0 < int(results[0].answer) < config.job_tasks, results[0].answer


# ----- item 7: a job lost with its fork server through no fault of its own runs again ----------------------

LOOP = "def solve(question, solver):\n    while True:\n        pass\n"


def test_the_jobs_beside_one_that_outlives_its_kill_run_again_and_keep_their_results():
    # A kill grace too short for any job to meet: the looping job's fork server is replaced at its
    # deadline. The looping job is the one at fault (timeout); the others were run again elsewhere.
    config = dataclasses.replace(CONFIG, workers=1, slots_per_worker=4, timeout_s=1.5, kill_grace_s=1e-3)
    with SandboxPool(config, EchoGenerator()) as p:
        # The second three normal jobs run from about 1 s to 2 s: the replacement at 1.5 s takes them down.
        results = p.run([Job(LOOP, "x", tag="attack")] + normals(SLOW, 6), exact)
        assert results[0].status == "timeout"
        assert scores(results) == [(f"n{i}", "ok", 1.0) for i in range(6)], results
        assert p.await_capacity(10.0)


# ----- what every job holds ------------------------------------------------------------------------------


def test_a_job_holds_no_capability_and_a_tmpfs_of_its_own_with_size_and_inode_caps(pool):
    code = (
        "import os\n"
        "def solve(question, solver):\n"
        "    status = dict(l.split(':', 1) for l in open('/proc/self/status').read().splitlines() if ':' in l)\n"
        "    caps = [status[k].strip() for k in ('CapEff', 'CapPrm', 'CapInh', 'CapAmb')]\n"
        "    mine = [l.split(' - ')[1] for l in open('/proc/self/mountinfo') if f' {os.getcwd()} ' in l]\n"
        "    return repr((os.getcwd(), caps, mine))\n"
    )
    (r,) = pool.run([Job(code, "q")])
    cwd, caps, mounts = eval(r.answer)
    assert caps == ["0000000000000000"] * 4
    assert cwd == isolation.JOBS_DIR
    options = mounts[-1].split()[-1].split(",")  # The last mount on the work dir is the one in use.
    assert f"size={pool.config.job_disk_bytes >> 10}k" in options, mounts
    assert f"nr_inodes={pool.config.job_inodes}" in options, mounts
    assert probe(pool)["capeff"] == "0000000000000000"


# ----- item 8: jobs run as an unprivileged host uid, not as host root ---------------------------------------

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="only root maps the sandbox to another host uid")
ALONE = dataclasses.replace(CONFIG, workers=1, slots_per_worker=2)


def _processes_under(root: int) -> dict[int, dict[str, str]]:
    """/proc/<pid>/status of `root` and of every process below it, as the host sees them."""
    children = collections.defaultdict(list)
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/stat") as f:
                children[int(f.read().rsplit(")", 1)[1].split()[1])].append(int(name))
        except (OSError, ValueError):
            continue
    found, todo = {}, [root]
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/status") as f:
                found[pid] = {k: v.strip() for k, v in (line.split(":", 1) for line in f if ":" in line)}
        except OSError:
            continue
        todo += children[pid]
    return found


def _sandbox_python(processes: dict) -> dict[int, dict[str, str]]:
    """The sandbox's Python processes (the server and its children), not bubblewrap's own two."""
    return {pid: status for pid, status in processes.items() if status["Name"] != "bwrap"}


@as_root
def test_a_job_and_its_fork_server_run_as_an_unprivileged_host_uid(monkeypatch):
    # bubblewrap maps the sandbox's uid 65534 to the caller's, so jobs were host root underneath: every
    # root-owned file was theirs, to lease, to write where a mount was not read-only. Now 65534 is a host
    # uid that owns nothing, seen from inside (/proc/self/uid_map) and from the host (the job's and the
    # fork server's /proc/<pid>/status), with no supplementary group and only the capabilities they use.
    monkeypatch.delenv(isolation.HOST_UID_ENV, raising=False)
    host_uid = isolation.DEFAULT_HOST_UID
    code = (
        "import os, time\n"
        "def solve(question, solver):\n"
        "    maps = [open(f'/proc/self/{m}').read().split() for m in ('uid_map', 'gid_map')]\n"
        "    open('mine', 'w').write('x')\n"
        "    time.sleep(1.0)\n"  # While the host looks at it.
        "    return repr((maps, os.getresuid(), os.getresgid(), os.getgroups(), os.stat('mine').st_uid))\n"
    )
    with SandboxPool(ALONE, EchoGenerator()) as p:
        results = []
        runner = threading.Thread(target=lambda: results.extend(p.run([Job(code, "q")])))
        runner.start()
        deadline, seen = time.monotonic() + 10, {}
        while time.monotonic() < deadline and len(seen) < 2:  # The fork server and the job.
            time.sleep(0.1)
            seen = _sandbox_python(_processes_under(p.worker_pids[0]))
        runner.join()
    assert len(seen) == 2, seen
    for pid, status in seen.items():
        assert status["Uid"].split() == [str(host_uid)] * 4 and status["Gid"].split() == [str(host_uid)] * 4, status
        assert status["Groups"] == "" and int(status["CapInh"], 16) == int(status["CapAmb"], 16) == 0, status
        # The fork server keeps CAP_SYS_ADMIN (its jobs' tmpfs mounts), in its user namespace only; the job none.
        assert int(status["CapBnd"], 16) == 1 << 21, status
    assert sorted(int(s["CapEff"], 16) for s in seen.values()) == [0, 1 << 21]
    (r,) = results
    assert r.status == "ok", r
    maps, uids, gids, groups, owner = eval(r.answer)
    mapping = ["0", "0", "1", "65534", str(host_uid), "1"]  # Root is bubblewrap's, to mount; 65534 the job's.
    assert maps == [mapping, mapping] and uids == gids == (65534,) * 3 and groups == [] and owner == 65534, r.answer


@as_root
def test_the_scorer_process_runs_as_the_unprivileged_host_uid(monkeypatch):
    monkeypatch.delenv(isolation.HOST_UID_ENV, raising=False)
    scorer = ScorerProcess(ALONE)
    try:
        scorer._start()
        seen = _sandbox_python(_processes_under(scorer.pid))
    finally:
        scorer.close()
    assert seen, "no scorer process found"
    for status in seen.values():
        assert status["Uid"].split() == [str(isolation.DEFAULT_HOST_UID)] * 4, status
        assert int(status["CapEff"], 16) == int(status["CapPrm"], 16) == int(status["CapBnd"], 16) == 0, status


def _root_owned_files() -> tuple[str, str, str]:
    """A world-readable dir of root's outside /tmp (the sandbox's /tmp is its own), holding a 0644 file
    and a 0600 one, for extra_ro_binds."""
    if not os.path.isdir("/var/tmp"):
        pytest.skip("no /var/tmp to hold a root-owned file outside the sandbox's /tmp")
    import tempfile

    folder = tempfile.mkdtemp(prefix="hljax-uid-", dir="/var/tmp")
    os.chmod(folder, 0o755)
    for name, mode in (("public", 0o644), ("secret", 0o600)):
        with open(os.path.join(folder, name), "w") as f:
            f.write(name)
        os.chmod(os.path.join(folder, name), mode)
    return folder, os.path.join(folder, "public"), os.path.join(folder, "secret")


@as_root
def test_a_lease_on_a_root_owned_file_is_refused_for_ownership_without_the_seccomp_rule(monkeypatch):
    # seccomp's F_SETLEASE rule is taken out of the jobs' filter here. The kernel grants a lease only to
    # the file's owner (or CAP_LEASE, which no job holds): a job as the unprivileged host uid gets EACCES
    # on a root-owned file, where the filter's refusal would be EPERM, and its own file's lease is granted
    # (so the rule really is absent). The same pool with HLJAX_SANDBOX_HOST_UID=caller, jobs host root
    # underneath, is granted the root-owned file's lease and reads the 0600 one: ownership made the difference.
    folder, public, secret = _root_owned_files()
    monkeypatch.delitem(seccomp._FCNTL_REFUSED, "F_SETLEASE")
    code = f"""
import errno, fcntl, os
def attempt(call):
    try:
        call()
        return 'ok'
    except OSError as e:
        return errno.errorcode[e.errno]
def solve(question, solver):
    open('mine', 'w').write('x')
    public, mine = os.open({public!r}, os.O_RDONLY), os.open('mine', os.O_RDONLY)
    out = [attempt(lambda: fcntl.fcntl(public, fcntl.F_SETLEASE, fcntl.F_RDLCK)),
           attempt(lambda: fcntl.fcntl(public, fcntl.F_SETLEASE, fcntl.F_UNLCK)),
           attempt(lambda: os.close(os.open({secret!r}, os.O_RDONLY))),
           attempt(lambda: fcntl.fcntl(mine, fcntl.F_SETLEASE, fcntl.F_RDLCK))]
    return ' '.join(out)
"""
    config = dataclasses.replace(ALONE, extra_ro_binds=(folder,))
    try:
        monkeypatch.delenv(isolation.HOST_UID_ENV, raising=False)
        with SandboxPool(config, EchoGenerator()) as p:
            (unprivileged,) = p.run([Job(code, "q")])
        monkeypatch.setenv(isolation.HOST_UID_ENV, "caller")
        with SandboxPool(config, EchoGenerator()) as p:
            (as_root,) = p.run([Job(code, "q")])
    finally:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)
    assert unprivileged.answer == "EACCES EACCES EACCES ok", unprivileged
    assert as_root.answer == "ok ok ok ok", as_root


@as_root
def test_an_unprivileged_uid_that_cannot_be_set_up_is_a_one_line_error_naming_the_way_back(monkeypatch, tmp_path):
    # Never a silent fallback to host root: the pool does not start, and says how to choose root.
    monkeypatch.delenv(isolation.HOST_UID_ENV, raising=False)
    helper = isolation._USERNS_HELPER
    refused = "import sys; sys.exit('unshare(CLONE_NEWUSER): Operation not permitted')"
    monkeypatch.setattr(isolation, "_USERNS_HELPER", refused)
    with pytest.raises(isolation.SandboxUnavailable) as e:
        SandboxPool(ALONE, EchoGenerator())
    message = str(e.value)
    assert "\n" not in message and "Operation not permitted" in message and "HLJAX_SANDBOX_HOST_UID=caller" in message
    monkeypatch.setattr(isolation, "_USERNS_HELPER", helper)
    # A bound path the unprivileged uid could not read: refused before bubblewrap starts, by name.
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    with pytest.raises(isolation.SandboxUnavailable, match=f"{private} .* not readable by other users"):
        SandboxPool(dataclasses.replace(ALONE, extra_ro_binds=(str(private),)), EchoGenerator())
    monkeypatch.setenv(isolation.HOST_UID_ENV, "-5")
    with pytest.raises(isolation.SandboxUnavailable, match="HLJAX_SANDBOX_HOST_UID"):
        SandboxPool(ALONE, EchoGenerator())
