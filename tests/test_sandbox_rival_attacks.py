"""Jobs sabotaging the other jobs of their fork server, or exhausting what the machine shares
(issue 19, items 3 and 6). Each runs beside normal jobs.
"""

import dataclasses
import os

import pytest

from sandbox import pids
from sandbox.pool import SandboxPool
from sandbox.results import Job
from tests._sandbox_attack_kit import (  # noqa: F401 - `pool` is a fixture.
    CONFIG, NORMAL, OWN_PIDNS, guarded, needs_bwrap, pool, require_contained, run_among_normals,
)
from tests._sandbox_fakes import EchoGenerator

pytestmark = needs_bwrap


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


# ----- sharing the fork server's task cap (issue 19, item 3) ---------------------------------------------

FLOOD = (
    "import threading\n"
    "def solve(q, s):\n"
    # Small stacks, so the address-space limit is not what stops the flood.
    "    threading.stack_size(64 << 10)\n"
    "    gate, threads, error = threading.Event(), [], ''\n"
    "    try:\n"
    "        for _ in range(3000):\n"
    "            t = threading.Thread(target=gate.wait, daemon=True)\n"
    "            t.start()\n"
    "            threads.append(t)\n"
    "    except RuntimeError as e:\n"
    "        error = str(e)\n"
    "    made = sum(t.is_alive() for t in threads)\n"
    "    gate.set()\n"
    "    for t in threads:\n"
    "        t.join()\n"
    "    return f'{made} {error}'\n"
)


def _capped_here() -> bool:
    """Whether any layer of sandbox/pids.py binds on this machine."""
    cgroup = pids.PidsCgroup.create(16, "probe")
    if cgroup is not None:
        cgroup.remove()
        return True
    return os.geteuid() != 0


def test_a_thread_flood_stops_at_the_fork_servers_task_cap():
    if not _capped_here():
        pytest.skip("root without a writable pids cgroup: the task cap cannot bind here (the pool warns)")
    # A cap well below what the address-space limit allows (about 490 threads of 64 KiB at 256 MiB).
    with SandboxPool(dataclasses.replace(CONFIG, max_tasks=64), EchoGenerator()) as capped:
        r = run_among_normals(capped, FLOOD)
    made, _, error = r.answer.partition(" ")
    # The cap counts the fork server, bwrap and the other jobs too, so the flood gets fewer than max_tasks.
    assert 0 < int(made) < 64, r.answer
    assert "can't start new thread" in error, r.answer


def test_fork_servers_sit_in_their_own_pids_cgroup_removed_at_close():
    probe = pids.PidsCgroup.create(16, "probe")
    if probe is None:
        pytest.skip("no writable pids cgroup on this machine")
    probe.remove()
    config = dataclasses.replace(CONFIG, max_tasks=64)
    with SandboxPool(config, EchoGenerator()) as p:
        groups = [w.cgroup for w in p._workers]
        assert all(g is not None for g in groups)
        for g, pid in zip(groups, p.worker_pids):
            with open(os.path.join(g.path, "pids.max")) as f:
                assert f.read().strip() == "64"
            with open(os.path.join(g.server, "cgroup.procs")) as f:  # The fork server's own leaf.
                assert str(pid) in f.read().split()
            assert len(g.slots) == config.slots_per_worker
            for slot in g.slots:  # One capped leaf per job slot (tests/test_sandbox_neighbour_attacks.py).
                with open(os.path.join(slot, "pids.max")) as f:
                    assert f.read().strip() == str(config.job_tasks)
        (r,) = p.run([Job(NORMAL, "x", reference="echo:x")], lambda a, j: a == j.reference)
        assert r.score == 1.0
    assert not any(os.path.exists(g.path) for g in groups)


# ----- reaching a rival's scheduling or its signals (issue 19, item 6) -----------------------------------


def test_a_job_cannot_renice_pin_or_signal_a_rival_through_the_scheduler_or_fcntl(pool):
    require_contained(pool)
    body = (
        "    import errno, fcntl\n"
        "    rival = os.getppid()  # The fork server: a process of the same uid, like any rival job.\n"
        "    r, w = os.pipe()\n"
        "    calls = [('setpriority', lambda: os.setpriority(os.PRIO_PROCESS, rival, 19)),\n"
        "             ('setpriority_user', lambda: os.setpriority(os.PRIO_USER, 0, 19)),\n"
        "             ('affinity', lambda: os.sched_setaffinity(rival, {0})),\n"
        "             ('scheduler', lambda: os.sched_setscheduler(rival, os.SCHED_IDLE, os.sched_param(0))),\n"
        "             ('setown', lambda: fcntl.fcntl(r, fcntl.F_SETOWN, rival)),\n"
        "             ('setsig', lambda: fcntl.fcntl(r, 10, 9)),\n"
        "             ('own_affinity', lambda: os.sched_setaffinity(os.getpid(), os.sched_getaffinity(os.getpid())))]\n"
        "    out = []\n"
        "    for name, call in calls:\n"
        "        try:\n"
        "            call()\n"
        "            out.append(f'{name}=ok')\n"
        "        except OSError as e:\n"
        "            out.append(f'{name}={errno.errorcode[e.errno]}')\n"
        "    return ' '.join(out)\n"
    )
    r = run_among_normals(pool, guarded(body), question=OWN_PIDNS)
    assert r.answer == ("setpriority=EPERM setpriority_user=EPERM affinity=EPERM scheduler=EPERM setown=EPERM "
                        "setsig=EPERM own_affinity=ok"), r.answer


# ----- the shared work root (issue 19, item 6) --------------------------------------------------------


def test_a_job_sees_and_fills_its_own_disk_only_and_nothing_outlives_it(pool):
    # Each job has a tmpfs of its own on its work dir (jail.JobDisk): it starts empty (no sibling's work
    # dir to find), /tmp around it is read-only, chmod is refused, and filling it (16 files of 15 MiB)
    # stops at its own job_disk_bytes.
    code = (
        "import errno, os\n"
        "def attempt(call):\n"
        "    try:\n"
        "        call()\n"
        "        return 'ok'\n"
        "    except OSError as e:\n"
        "        return errno.errorcode[e.errno]\n"
        "def solve(q, s):\n"
        "    out = [str(os.listdir('.')), attempt(lambda: open('/tmp/litter', 'w').write('x')),\n"
        "           attempt(lambda: os.chmod('.', 0o777))]\n"
        "    chunk, written = b'x' * (15 << 20), 0\n"
        "    for i in range(16):\n"
        "        try:\n"
        "            with open(f'f{i}', 'wb') as f:\n"
        "                f.write(chunk)\n"
        "            written += 15\n"
        "        except OSError as e:\n"
        "            out.append(errno.errorcode[e.errno])\n"
        "            break\n"
        "    return ' '.join(out + [str(written)])\n"
    )
    assert pool.config.job_disk_bytes == 64 << 20
    assert run_among_normals(pool, code).answer == "[] EROFS EPERM ENOSPC 60"
    # Every later job can still write: 48 MiB each, 3 at once on each fork server.
    writer = (
        "def solve(q, s):\n"
        "    for i in range(4):\n"
        "        with open(f'w{i}', 'wb') as f:\n"
        "            f.write(b'y' * (12 << 20))\n"
        "    return 'echo:' + q\n"
    )
    results = pool.run([Job(writer, f"w{i}", reference=f"echo:w{i}") for i in range(6)], lambda a, j: a == j.reference)
    assert [(r.status, r.score) for r in results] == [("ok", 1.0)] * 6, results
