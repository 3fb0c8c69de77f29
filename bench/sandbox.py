"""Per-job overhead of `SandboxPool` vs a fresh `python -c` subprocess per job, same trivial harness.

    python bench/sandbox.py [--jobs 1000] [--baseline-jobs 60] [--rounds 5] [--isolation bwrap]

The harness returns its question: everything measured is overhead. Both sides run the jobs one
at a time ("serial": a pool of 1 fork server x 1 slot vs one subprocess at a time) and in parallel
("parallel": the pool's default 2 x 4 slots vs 2 concurrent subprocesses, this machine having 2
cores). The two sides alternate in `--rounds` chunks so that both see the same background load.
Prints ms per job (wall time / jobs), CPU ms per job (all processes involved), and the ratio.
"""

import argparse
import os
import resource
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sandbox.config import SandboxConfig  # noqa: E402
from sandbox.pool import SandboxPool  # noqa: E402
from sandbox.results import Job  # noqa: E402

HARNESS = "def solve(question, solver):\n    return question\n"
PYTHON = os.path.realpath(sys.executable)


def _fresh_process(i: int) -> None:
    code = HARNESS + "import sys\nprint(solve(sys.argv[1], None))\n"
    out = subprocess.run([PYTHON, "-I", "-c", code, f"q{i}"], capture_output=True, text=True, check=True).stdout
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
    t = {"base_wall": 0.0, "base_cpu": 0.0, "pool_wall": 0.0, "pool_cpu": 0.0}
    _fresh_process(0)  # Warm the page cache.
    with SandboxPool(config, generator=None) as pool, ThreadPoolExecutor(concurrency) as ex:
        pool.run([Job(HARNESS, "warm")] * 50)
        for r in range(rounds):
            cpu0, t0 = _children_cpu_s(), time.perf_counter()
            list(ex.map(_fresh_process, range(baseline_jobs // rounds)))
            t["base_wall"] += time.perf_counter() - t0
            t["base_cpu"] += _children_cpu_s() - cpu0

            batch = [Job(HARNESS, f"q{i}") for i in range(jobs // rounds)]
            cpu0, own0, t0 = _tree_cpu_s(pool.worker_pids), time.process_time(), time.perf_counter()
            results = pool.run(batch)
            t["pool_wall"] += time.perf_counter() - t0
            t["pool_cpu"] += _tree_cpu_s(pool.worker_pids) - cpu0 + time.process_time() - own0
            assert [res.answer for res in results] == [j.question for j in batch], results[0]
    n_base, n_pool = baseline_jobs // rounds * rounds, jobs // rounds * rounds
    return {k: v * 1000 / (n_base if k.startswith("base") else n_pool) for k, v in t.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--baseline-jobs", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--isolation", default="bwrap", choices=["bwrap", "rlimits_only"])
    args = parser.parse_args()
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}, {args.jobs} pool jobs, ms per job:")
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


if __name__ == "__main__":
    main()
