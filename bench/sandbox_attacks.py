"""Every sandbox attack beside normal jobs on a real `SandboxPool`, measured against issue 36's goals.

    python bench/sandbox_attacks.py [--normals 8] [--only NAME ...]

Each attack (those of issue 36 and the earlier ones of issue 19, their code taken from the attack
tests where it is a constant there) runs as one job among `--normals` normal jobs in a pool with the
attack tests' config (tests/_sandbox_attack_kit.py: bubblewrap, 2 fork servers x 3 slots, 2 s
deadline, 256 MiB). One row per attack:

- contained: the attack's effect is absent (its own result says so, checked as the tests check it)
  and no fork server was replaced (the last row kills one from outside on purpose: "-").
- right / lost / infra: the normal jobs that came back correct, that came back with a wrong answer
  or none, and that came back infra_error.
- tick stall: the longest gap, less its 10 ms period, of a thread of this (the supervisor's) process
  that ticks every 10 ms: the GIL held, or the process not scheduled.
- busy pass: the supervisor loop's longest pass less its time waiting in select(): how long it did
  not look at its jobs' deadlines and channels.
- cap back: from the first moment `pool.capacity < config.workers` to full capacity again (polled
  every 10 ms); n/a if capacity never dropped.
- RSS: the supervisor process's resident size, growth at the row's end and at its peak; host: the
  drop of /proc/meminfo's MemAvailable over the row (other jobs on the machine move it too).

Goals (issue 36): 0 results lost, 0 infra_error on innocent jobs, no stall over 1 s, full capacity
again within 5 s. The machine's load is printed first: these are wall-clock measures, and a loaded
machine (2 cores here, shared) makes stalls and recoveries longer than the code alone does.
"""

import argparse
import dataclasses
import os
import platform
import signal
import sys
import threading
import time
from typing import Callable

import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sandbox.config import SolverConfig  # noqa: E402
from sandbox.pool import SandboxPool  # noqa: E402
from sandbox.results import Job, JobResult  # noqa: E402
from tests import test_sandbox_neighbour_attacks as n36  # noqa: E402
from tests._sandbox_attack_kit import CONFIG, KILL_BODY, NORMAL, OWN_PIDNS, SECRET, TAIL, guarded  # noqa: E402
from tests._sandbox_fakes import EchoGenerator  # noqa: E402

GOAL_STALL_S = 1.0
GOAL_CAPACITY_S = 5.0


@dataclasses.dataclass
class Attack:
    name: str
    code: str
    check: Callable[[JobResult], bool]  # Whether the attack's effect is absent, from its own result.
    question: str = "attack"
    normal: str = NORMAL  # The normal jobs' harness: the victims this attack aims at.
    tools: dict | None = None  # For the attack and the normal jobs.
    config: dict | None = None  # Overrides of CONFIG: the row gets a pool of its own.
    watch: str | None = None  # A file the trusted side opens every 20 ms: the longest open() is checked.
    kill_server: bool = False  # Not an attack: a fork server SIGKILLed from outside 0.5 s in.
    reference: Callable[[str], str] = lambda question: f"echo:{question}"  # A normal job's right answer.


def _status(status: str, error_type: str | None = None) -> Callable[[JobResult], bool]:
    return lambda r: r.status == status and (error_type is None or (r.error is not None and r.error.type == error_type))


def _answer(expected: str) -> Callable[[JobResult], bool]:
    return lambda r: r.answer == expected


def _int_answer(low: int, high: int) -> Callable[[JobResult], bool]:
    return lambda r: r.status == "ok" and r.answer is not None and r.answer.isdigit() and low < int(r.answer) < high


LOOP_CATCHING = (
    "def solve(q, s):\n    while True:\n        try:\n            while True:\n                pass\n"
    "        except BaseException:\n            pass\n"
)
MEMORY_BOMB = (
    "import resource\ndef solve(q, s):\n    try:\n"
    "        resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY,) * 2)\n"
    "    except (OSError, ValueError):\n        pass\n    hog = []\n    while True:\n"
    "        hog.append(bytearray(32 << 20))\n"
)
SPAWNERS = (
    "    import subprocess, multiprocessing\n    out = []\n"
    "    starts = (lambda: subprocess.run(['/bin/true']), lambda: multiprocessing.Process(target=print).start())\n"
    "    for start in starts:\n        try:\n            start()\n            out.append('started')\n"
    "        except OSError as e:\n            out.append(type(e).__name__)\n    return ' '.join(out)\n"
)
THREAD_SPRAY = (
    "import threading, time\ndef solve(q, s):\n    n = 0\n    try:\n        while True:\n"
    "            threading.Thread(target=time.sleep, args=(1000,), daemon=True).start()\n            n += 1\n"
    "    except RuntimeError:\n        return str(n)\n"
)
STDOUT_200MB = (
    "import sys\ndef solve(q, s):\n    chunk = 'x' * (1 << 20)\n    for _ in range(200):\n"
    "        sys.stdout.write(chunk)\n    return 'done'\n"
)
SOCKETS = (
    "import socket\n"
    "def attempt(family, kind, addr):\n    try:\n        s = socket.socket(family, kind)\n"
    "    except OSError as e:\n        return f'socket errno {e.errno}'\n    s.settimeout(1)\n    try:\n"
    "        s.connect(addr)\n        return 'connected'\n    except OSError as e:\n"
    "        return f'connect errno {e.errno}'\n"
    "def solve(q, s):\n"
    "    tries = [(socket.AF_INET, socket.SOCK_STREAM, ('127.0.0.1', 9)), (socket.AF_INET, socket.SOCK_STREAM, ('192.0.2.1', 80)),\n"
    "             (socket.AF_INET, socket.SOCK_DGRAM, ('192.0.2.1', 53)), (socket.AF_INET6, socket.SOCK_STREAM, ('::1', 80)),\n"
    "             (socket.AF_NETLINK, socket.SOCK_RAW, (0, 0)), (socket.AF_UNIX, socket.SOCK_STREAM, '\\0abstract')]\n"
    "    return ','.join(attempt(*t) for t in tries)\n"
)
WRITE_OUTSIDE = (
    "def solve(q, s):\n    out = []\n"
    "    for path in ['/etc/pwned', '/usr/pwned', '/pwned', '/opt/hljax/sandbox/worker.py', '/root/pwned']:\n"
    "        try:\n            open(path, 'a').write('x')\n            out.append('wrote')\n"
    "        except OSError as e:\n            out.append(type(e).__name__)\n"
    "    try:\n        open('big.bin', 'wb').write(b'0' * (32 << 20))\n        out.append('wrote big')\n"
    "    except OSError as e:\n        out.append(e.strerror)\n    return ','.join(out)\n"
)
SECRETS = (
    "import os\ndef solve(q, s):\n    found = [repr(dict(os.environ))]\n"
    "    for path in ['/etc/shadow', '/etc/passwd', '/root/.bash_history', '/proc/1/environ', '/proc/self/environ']:\n"
    "        try:\n            found.append(path + '=' + open(path, 'rb').read().decode('latin-1'))\n"
    "        except OSError as e:\n            found.append(path + ':' + type(e).__name__)\n"
    "    return '\\n'.join(found)\n"
)
CTYPES_SYSCALLS = (
    "    import ctypes\n    libc = ctypes.CDLL(None, use_errno=True)\n    out = []\n"
    "    calls = [('kill', lambda: libc.kill(-1, 9)), ('fork', lambda: libc.syscall(57)),\n"
    "             ('clone', lambda: libc.syscall(56, 17, 0, 0, 0, 0)), ('ptrace', lambda: libc.ptrace(16, 1, 0, 0))]\n"
    "    for name, call in calls:\n        rc = call()\n        out.append(f'{name}={rc}/{ctypes.get_errno()}')\n"
    "    return ' '.join(out)\n"
)
PROC_SYS = (
    "import errno, os\ndef solve(q, s):\n    opened = []\n"
    "    for path in ['/proc/sys/kernel/core_pattern', '/proc/sys/vm/overcommit_memory', '/proc/sys/vm/drop_caches']:\n"
    "        try:\n            os.close(os.open(path, os.O_WRONLY))\n            opened.append('opened')\n"
    "        except OSError as e:\n            opened.append(errno.errorcode[e.errno])\n"
    "    return f'{os.getuid()} ' + ' '.join(opened)\n"
)
DEV_MEMORY = (
    "import errno, os\n"
    "def hold(create):\n    chunk, fds = b'x' * (15 << 20), []\n    try:\n        for i in range(20):\n"
    "            fds.append(create(i))\n            os.write(fds[-1], chunk)\n        return 'held'\n"
    "    except OSError as e:\n        return errno.errorcode[e.errno]\n    finally:\n        for fd in fds:\n"
    "            os.close(fd)\n"
    "def solve(q, s):\n    flags = os.O_WRONLY | os.O_CREAT\n"
    "    return ','.join([hold(lambda i: os.open(f'/dev/shm/hog{i}', flags, 0o600)),\n"
    "                     hold(lambda i: os.open(f'/dev/hog{i}', flags, 0o600)), hold(lambda i: os.memfd_create(f'hog{i}'))])\n"
)
MESSAGE_FLOOD = (
    "import json, os, threading, time\n"
    "def drain():\n    while os.read(3, 1 << 16):\n        pass\n"
    "def solve(q, s):\n    threading.Thread(target=drain, daemon=True).start()\n"
    "    body = json.dumps({'t': 'tool', 'name': 'nope', 'args': [], 'kwargs': {}}).encode()\n"
    "    frames = (len(body).to_bytes(4, 'big') + body) * 2000\n    end = time.monotonic() + 4\n"
    "    while time.monotonic() < end:\n        os.write(4, frames)\n    return 'done'\n"
)
SEED = (
    "from sandbox.runner import SolverError\ndef solve(question, solver):\n    try:\n"
    "        solver.generate('hi', seed=2**40)\n    except SolverError as e:\n        return f'refused: {e}'\n"
    "    return 'served'\n"
)
# Frames of empty lists just under the 4 MiB frame limit (the size), 10 of them: refused for their
# count of values before decoding, not for their size. DECODE_BOMB is the test's 1 MiB x 40.
DECODE_BOMB_4MIB = n36.DECODE_BOMB.replace("350000", "1398000").replace("range(40)", "range(10)")
FRAME_REFUSED = lambda r: r.status == "crashed" and "frame holds over" in (r.reason or "")  # noqa: E731
TOOLS = {"lookup": lambda q: f"echo:{q}"}
ALL_REFUSED = lambda r: r.answer is not None and r.answer != "REFUSED" and "=ok" not in r.answer  # noqa: E731

ATTACKS = [
    Attack("baseline (no attack)", NORMAL, _status("ok")),
    # ----- issue 19 -----
    Attack("infinite loop", "def solve(q, s):\n    while True:\n        pass\n", _status("timeout")),
    Attack("loop catching BaseException", LOOP_CATCHING, _status("timeout")),
    Attack("sleep forever", "import time\ndef solve(q, s):\n    time.sleep(10**6)\n", _status("timeout")),
    Attack("memory bomb", MEMORY_BOMB, _status("error", "MemoryError")),
    Attack("fork bomb", guarded("    while True:\n        os.fork()\n"), _status("error", "PermissionError"), OWN_PIDNS),
    Attack("subprocess/multiprocessing", guarded(SPAWNERS), _answer("PermissionError PermissionError"), OWN_PIDNS),
    Attack("thread spray (8 MiB stacks)", THREAD_SPRAY, _int_answer(0, 64)),
    Attack("200 MB of stdout", STDOUT_200MB, lambda r: r.answer == "done" and r.stdout_tail == "x" * TAIL),
    Attack("sys.exit", "import sys\ndef solve(q, s):\n    sys.exit(0)\n", _status("error", "SystemExit")),
    Attack("os._exit", "import os\ndef solve(q, s):\n    os._exit(0)\n", _status("crashed")),
    Attack("kill parent", guarded(KILL_BODY.format(target="os.getppid()")), _answer("refused errno 1"), OWN_PIDNS),
    Attack("kill -1", guarded(KILL_BODY.format(target="-1")), _answer("refused errno 1"), OWN_PIDNS),
    Attack("sockets", SOCKETS, _answer(",".join(["socket errno 1"] * 6))),
    Attack("writes outside the work dir", WRITE_OUTSIDE, lambda r: r.answer is not None and "wrote" not in r.answer),
    Attack("reading secrets", SECRETS, lambda r: r.answer is not None and SECRET not in r.answer
           and "/etc/shadow:FileNotFoundError" in r.answer),
    Attack("ctypes kill/fork/clone/ptrace", guarded(CTYPES_SYSCALLS), _answer("kill=-1/1 fork=-1/1 clone=-1/1 ptrace=-1/1"),
           OWN_PIDNS),
    Attack("segfault", "import ctypes\ndef solve(q, s):\n    return ctypes.string_at(0)\n", _status("crashed")),
    Attack("/proc/sys knobs", PROC_SYS, lambda r: r.answer is not None and "opened" not in r.answer
           and r.answer.startswith("65534 ")),
    Attack("memory in /dev, /dev/shm, memfd", DEV_MEMORY, _answer("EROFS,EROFS,EPERM")),
    Attack("garbage frame", "import os\ndef solve(q, s):\n    os.write(4, b'\\x00\\x00\\x00\\x05notjs')\n    return 'x'\n",
           _status("crashed")),
    Attack("4 GiB frame header", "import os, time\ndef solve(q, s):\n    os.write(4, b'\\xff\\xff\\xff\\xff')\n"
           "    time.sleep(1)\n    return 'x'\n", _status("crashed")),
    Attack("deeply nested JSON", "import os\ndef solve(q, s):\n    body = b'[' * 200000 + b']' * 200000\n"
           "    os.write(4, len(body).to_bytes(4, 'big') + body)\n    return 'x'\n", FRAME_REFUSED),
    Attack("message flood (4 s)", MESSAGE_FLOOD, lambda r: r.status == "timeout" and r.run_s < CONFIG.timeout_s + 0.5),
    # ----- issue 36 -----
    Attack("leases, F_SETOWN, ioctls, sync", guarded(n36.LEASE_BODY), ALL_REFUSED, OWN_PIDNS, n36.IMPORTER,
           watch=n36.LEASED),
    Attack("refused/malformed solver calls", n36.SPAMMER, _answer("16 24 0"), normal=n36.CALLER,
           reference=lambda q: " ".join(f"echo:{q}-{k}" for k in range(4))),
    Attack("seed 2**40", SEED, lambda r: r.status == "ok" and r.answer.startswith("refused: seed must be in")),
    Attack("empty dirs until its deadline", n36.DIRS, _status("timeout"), normal=n36.SLOW),
    Attack("disk filling", n36.FILLER, _answer("full"), normal=n36.WRITER),
    Attack("thread flood (pids cgroup)", n36.FLOOD, _int_answer(0, 10**9), normal=n36.THREADED,
           config=dict(workers=1, slots_per_worker=4, max_tasks=64, memory_bytes=1 << 30)),
    Attack("1 MiB decode-bomb frames x40", n36.DECODE_BOMB, FRAME_REFUSED, normal=n36.TOOL_USER, tools=TOOLS),
    Attack("4 MiB decode-bomb frames x10", DECODE_BOMB_4MIB, FRAME_REFUSED, normal=n36.TOOL_USER, tools=TOOLS),
    # ----- not an attack: what a dead fork server costs -----
    Attack("fork server SIGKILLed (outside)", NORMAL, _status("ok"), kill_server=True),
]


class Meter:
    """Runs in the supervisor's process while a row runs: a 10 ms ticker (longest gap, capacity drops,
    peak RSS) and the loop's busy time per pass (select() wrapped, `_dispatch` ending each pass)."""

    def __init__(self, pool: SandboxPool):
        self.pool = pool
        self.proc = psutil.Process()
        self.rss0 = self.rss_peak = self.proc.memory_info().rss
        self.tick_stall = 0.0
        self.dropped_at: float | None = None
        self.back_at: float | None = None
        self.busy_pass = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick, daemon=True)
        self._selected = 0.0
        self._pass_end: float | None = None
        self._selected_at_end = 0.0
        selector = pool._selector
        real_select, real_dispatch = type(selector).select, type(pool)._dispatch

        def select(timeout=None):
            start = time.monotonic()
            try:
                return real_select(selector, timeout)
            finally:
                self._selected += time.monotonic() - start

        def end_of_pass(calls, now):
            real_dispatch(pool, calls, now)
            t = time.monotonic()
            if self._pass_end is not None:
                busy = (t - self._pass_end) - (self._selected - self._selected_at_end)
                self.busy_pass = max(self.busy_pass, busy)
            self._pass_end, self._selected_at_end = t, self._selected

        selector.select = select
        pool._dispatch = end_of_pass
        self._unpatch = lambda: (delattr(selector, "select"), delattr(pool, "_dispatch"))

    def _tick(self):
        last, n = time.monotonic(), 0
        while not self._stop.is_set():
            time.sleep(0.01)
            now = time.monotonic()
            self.tick_stall = max(self.tick_stall, now - last - 0.01)
            last = now
            full = self.pool.capacity == self.pool.config.workers
            if not full and self.dropped_at is None:
                self.dropped_at = now
            elif full and self.dropped_at is not None and self.back_at is None:
                self.back_at = now
            n += 1
            if n % 5 == 0:
                self.rss_peak = max(self.rss_peak, self.proc.memory_info().rss)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._unpatch()
        self.rss_peak = max(self.rss_peak, self.proc.memory_info().rss)
        self.rss_end = self.proc.memory_info().rss


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) << 10
    return 0


def run_row(pool: SandboxPool, attack: Attack, n_normals: int) -> dict:
    normals = [Job(attack.normal, f"n{i}", reference=attack.reference(f"n{i}"), tag=f"n{i}", tools=attack.tools)
               for i in range(n_normals)]
    jobs = normals[:2] + [Job(attack.code, attack.question, tag="attack", tools=attack.tools)] + normals[2:]
    servers = pool.worker_pids
    avail0 = mem_available()
    stop, open_stall = threading.Event(), [0.0]
    watcher = threading.Thread(target=n36._open_stalls, args=(attack.watch, stop, open_stall)) if attack.watch else None
    killer = None
    if attack.kill_server:
        killer = threading.Timer(0.5, lambda: os.kill(pool.worker_pids[0], signal.SIGKILL))
    start = time.monotonic()
    with Meter(pool) as meter:
        if watcher:
            watcher.start()
        if killer:
            killer.start()
        try:
            results = pool.run(jobs, lambda a, j: a == j.reference)
        finally:
            stop.set()
            if watcher:
                watcher.join()
            if killer:
                killer.join()
        wall = time.monotonic() - start
        if meter.dropped_at is not None or pool.capacity < pool.config.workers:
            pool.await_capacity(60.0)
            time.sleep(0.02)  # One more tick to see it back.
    by_tag = {r.tag: r for r in results if r is not None}
    right = sum(1 for j in normals if (r := by_tag.get(j.tag)) is not None and r.status == "ok" and r.score == 1.0)
    infra = sum(1 for j in normals if (r := by_tag.get(j.tag)) is not None and r.status == "infra_error")
    attack_result = by_tag.get("attack")
    effect_absent = attack_result is not None and attack.check(attack_result)
    if attack.watch:
        effect_absent = effect_absent and open_stall[0] < 0.5
    replaced = pool.worker_pids != servers
    if meter.dropped_at is None:
        capacity = "n/a"
    elif meter.back_at is None:
        capacity = "never"
    else:
        capacity = meter.back_at - meter.dropped_at
    return {
        "name": attack.name,
        "contained": "-" if attack.kill_server else ("yes" if effect_absent and not replaced else "NO"),
        "right": right, "lost": n_normals - right - infra, "infra": infra,
        "tick_stall": meter.tick_stall, "busy_pass": meter.busy_pass, "capacity": capacity,
        "rss_mb": (meter.rss_end - meter.rss0) / 2**20, "rss_peak_mb": (meter.rss_peak - meter.rss0) / 2**20,
        "host_mb": (avail0 - mem_available()) / 2**20, "wall": wall,
        "attack": attack_result, "load": os.getloadavg()[0],
    }


def misses(row: dict, n: int) -> list[str]:
    out = []
    if row["right"] != n:
        out.append(f"{n - row['right']} normal job(s) not right")
    if row["infra"]:
        out.append(f"{row['infra']} infra_error")
    if max(row["tick_stall"], row["busy_pass"]) > GOAL_STALL_S:
        out.append("stall > 1 s")
    if row["capacity"] == "never" or (isinstance(row["capacity"], float) and row["capacity"] > GOAL_CAPACITY_S):
        out.append("capacity > 5 s")
    if row["contained"] == "NO":
        out.append("not contained")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--normals", type=int, default=8, help="normal jobs beside each attack")
    parser.add_argument("--only", nargs="*", help="run only the attacks whose name contains one of these")
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"host load at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores; python {platform.python_version()}")
    if load[0] > 1.5:
        print(f"WARNING: LOAD {load[0]:.2f} > 1.5: the machine is busy with other work; stalls and recovery "
              "times below are inflated by it (compare with the baseline row).", file=sys.stderr)
        print(f"WARNING: host load {load[0]:.2f} > 1.5 (see the baseline row)")
    attacks = [a for a in ATTACKS if not args.only or any(s in a.name for s in args.only)]
    if platform.machine() != "x86_64":
        attacks = [a for a in attacks if a.watch is None]  # Raw syscall numbers are x86_64's.
    os.environ["HLJAX_TEST_SECRET"] = SECRET  # In the supervisor's environment: must not reach jobs.
    generator = EchoGenerator(refuse="POISON", max_seed=2**32 - 1)
    solver = SolverConfig()
    header = (f"{'attack':34} {'contained':9} {'right/lost/infra':>16} {'tick stall':>10} {'busy pass':>9} "
              f"{'cap back':>8} {'RSS end/peak MB':>15} {'host MB':>7} {'wall s':>6} {'load':>5}")
    print(header)
    print("-" * len(header))
    rows = []
    shared = SandboxPool(CONFIG, generator, solver)
    try:
        for attack in attacks:
            if attack.config:
                with SandboxPool(dataclasses.replace(CONFIG, **attack.config), generator, solver) as own:
                    row = run_row(own, attack, args.normals)
            else:
                row = run_row(shared, attack, args.normals)
            rows.append(row)
            cap = row["capacity"] if isinstance(row["capacity"], str) else f"{row['capacity']:.2f}s"
            print(f"{row['name']:34} {row['contained']:9} {row['right']:>6}/{row['lost']}/{row['infra']:<7} "
                  f"{row['tick_stall'] * 1000:>8.0f}ms {row['busy_pass'] * 1000:>7.0f}ms {cap:>8} "
                  f"{row['rss_mb']:>+7.1f}/{row['rss_peak_mb']:<+7.1f} {row['host_mb']:>+7.0f} {row['wall']:>6.2f} "
                  f"{row['load']:>5.2f}", flush=True)
    finally:
        shared.close()
    print()
    bad = [(row, misses(row, args.normals)) for row in rows]
    bad = [(row, m) for row, m in bad if m]
    for row, m in bad:
        r = row["attack"]
        print(f"MISSES: {row['name']}: {'; '.join(m)} (attack's result: {r.status if r else None} "
              f"{(r.answer or r.reason or '')[:120]!r})" if r else f"MISSES: {row['name']}: {'; '.join(m)}")
    if not bad:
        print("every row meets the goals: 0 lost, 0 infra_error, stalls <= 1 s, full capacity within 5 s")
    load = os.getloadavg()
    print(f"host load at end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
