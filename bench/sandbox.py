"""Per-job overhead of `SandboxPool` vs a fresh `python -c` subprocess per job, same trivial harness.

    python bench/sandbox.py [--jobs 1000] [--baseline-jobs 60] [--rounds 5] [--isolation bwrap] [--allow-load]

The harness returns its question: everything measured is overhead. Both sides run the jobs one
at a time ("serial": a pool of 1 fork server x 1 slot vs one subprocess at a time) and in parallel
("parallel": the pool's default 2 x 4 slots vs 2 concurrent subprocesses, this machine having 2
cores). The two sides alternate in `--rounds` chunks so that both see the same background load.
Prints ms per job (wall time / jobs), CPU ms per job (all processes involved), and the ratio.

Two fresh-process baselines run in the same rounds: `python -I -c` (the old line, kept) and the
lean start `python -I -S -c` (no site: no site-packages scan, no .pth files; the job needs neither),
the fastest way to start a fresh interpreter per job. The ratio against the lean start is the
headline. The host's load is checked first (bench/host.py).
"""

import argparse
import os
import resource
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import host  # noqa: E402
from sandbox.config import SandboxConfig  # noqa: E402
from sandbox.pool import SandboxPool  # noqa: E402
from sandbox.results import Job  # noqa: E402

HARNESS = "def solve(question, solver):\n    return question\n"
PYTHON = os.path.realpath(sys.executable)


LOAD_REASON = ("ratios against fresh-process baselines are unreliable under load: an interpreter's start-up "
               "waits for a core at every fork, exec and page fault, so other jobs inflate the baseline")
BASELINES = {"base": ("-I",), "lean": ("-I", "-S")}  # Prefix of the per-job time/CPU keys -> interpreter flags.


def _fresh_process(i: int, flags: tuple[str, ...] = ("-I",)) -> None:
    code = HARNESS + "import sys\nprint(solve(sys.argv[1], None))\n"
    out = subprocess.run([PYTHON, *flags, "-c", code, f"q{i}"], capture_output=True, text=True, check=True).stdout
    assert out == f"q{i}\n", out


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _tree_cpu_s(pids: list[int]) -> float:
    """User + system seconds of `pids` and their descendants, live and reaped."""
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(ppid, []).append(int(entry))
    total, todo = 0, list(pids)
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return total / tick


def measure(config: SandboxConfig, concurrency: int, jobs: int, baseline_jobs: int, rounds: int) -> dict:
    """Wall and CPU seconds of both sides, summed over alternating rounds."""
    t = {f"{k}_{m}": 0.0 for k in (*BASELINES, "pool") for m in ("wall", "cpu")}
    for flags in BASELINES.values():
        _fresh_process(0, flags)  # Warm the page cache.
    with SandboxPool(config, generator=None) as pool, ThreadPoolExecutor(concurrency) as ex:
        pool.run([Job(HARNESS, "warm")] * 50)
        for r in range(rounds):
            for key, flags in BASELINES.items():
                cpu0, t0 = _children_cpu_s(), time.perf_counter()
                list(ex.map(lambda i, flags=flags: _fresh_process(i, flags), range(baseline_jobs // rounds)))
                t[f"{key}_wall"] += time.perf_counter() - t0
                t[f"{key}_cpu"] += _children_cpu_s() - cpu0

            batch = [Job(HARNESS, f"q{i}") for i in range(jobs // rounds)]
            cpu0, own0, t0 = _tree_cpu_s(pool.worker_pids), time.process_time(), time.perf_counter()
            results = pool.run(batch)
            t["pool_wall"] += time.perf_counter() - t0
            t["pool_cpu"] += _tree_cpu_s(pool.worker_pids) - cpu0 + time.process_time() - own0
            assert [res.answer for res in results] == [j.question for j in batch], results[0]
    n_base, n_pool = baseline_jobs // rounds * rounds, jobs // rounds * rounds
    return {k: v * 1000 / (n_pool if k.startswith("pool") else n_base) for k, v in t.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--baseline-jobs", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--isolation", default="bwrap", choices=["bwrap", "rlimits_only"])
    host.add_args(parser)
    args = parser.parse_args()
    host.check_args(args, LOAD_REASON)
    print(f"{args.jobs} pool jobs, ms per job:")  # Cores and load: host.check_args's line.
    rows = [
        ("serial", 1, SandboxConfig(isolation=args.isolation, workers=1, slots_per_worker=1)),
        ("parallel", 2, SandboxConfig(isolation=args.isolation)),
    ]
    for name, concurrency, config in rows:
        m = measure(config, concurrency, args.jobs, args.baseline_jobs, args.rounds)
        print(
            f"{name:8s} fresh python -c: {m['base_wall']:6.2f} wall, {m['base_cpu']:5.2f} CPU | "
            f"pool {config.workers}x{config.slots_per_worker}: {m['pool_wall']:5.2f} wall, {m['pool_cpu']:4.2f} CPU | "
            f"ratio {m['base_wall'] / m['pool_wall']:5.1f}x"
        )
        print(
            f"{name:8s} lean python -I -S -c: {m['lean_wall']:6.2f} wall, {m['lean_cpu']:5.2f} CPU | "
            f"pool {config.workers}x{config.slots_per_worker}: {m['pool_wall']:5.2f} wall, {m['pool_cpu']:4.2f} CPU | "
            f"pool vs lean start {m['lean_wall'] / m['pool_wall']:5.1f}x wall, "
            f"{m['lean_cpu'] / m['pool_cpu']:5.1f}x CPU",
            flush=True,
        )


if __name__ == "__main__":
    main()
