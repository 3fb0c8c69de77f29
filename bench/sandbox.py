"""Per-job overhead of `SandboxPool` vs a fresh `python -c` subprocess per job, same trivial harness.

    python bench/sandbox.py [--jobs 1000] [--baseline-jobs 60] [--isolation bwrap]

The harness returns its question: everything measured is overhead. Both sides run the jobs one
at a time ("serial": pool of 1 worker x 1 slot vs one subprocess at a time) and two at a time per
core ("parallel": the pool's default 2 x 4 slots vs 2 concurrent subprocesses, this machine having
2 cores). Prints ms per job (wall time / jobs), CPU ms per job of the pool's processes, and the ratio.
"""

import argparse
import os
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


def baseline_ms(jobs: int, concurrency: int) -> float:
    _fresh_process(0)  # Warm the page cache.
    t = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as ex:
        list(ex.map(_fresh_process, range(jobs)))
    return (time.perf_counter() - t) / jobs * 1000


def _cpu_s(pids: list[int]) -> float:
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


def pool_ms(jobs: int, config: SandboxConfig) -> tuple[float, float]:
    """(wall ms per job, CPU ms per job of supervisor + fork servers + jobs)."""
    with SandboxPool(config, generator=None) as pool:
        pool.run([Job(HARNESS, "warm")] * 50)
        batch = [Job(HARNESS, f"q{i}") for i in range(jobs)]
        cpu0, own0 = _cpu_s(pool.worker_pids), time.process_time()
        t = time.perf_counter()
        results = pool.run(batch)
        wall = time.perf_counter() - t
        cpu = _cpu_s(pool.worker_pids) - cpu0 + time.process_time() - own0
    assert [r.answer for r in results] == [f"q{i}" for i in range(jobs)], results[0]
    return wall / jobs * 1000, cpu / jobs * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--baseline-jobs", type=int, default=60)
    parser.add_argument("--isolation", default="bwrap", choices=["bwrap", "rlimits_only"])
    args = parser.parse_args()
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}, {args.jobs} pool jobs")
    rows = [
        ("serial", 1, SandboxConfig(isolation=args.isolation, workers=1, slots_per_worker=1)),
        ("parallel", 2, SandboxConfig(isolation=args.isolation)),
    ]
    for name, concurrency, config in rows:
        base = baseline_ms(args.baseline_jobs, concurrency)
        wall, cpu = pool_ms(args.jobs, config)
        print(
            f"{name:8s} fresh python -c: {base:6.2f} ms/job | pool ({config.workers}x{config.slots_per_worker}): "
            f"{wall:5.2f} ms/job, {cpu:5.2f} CPU ms/job | ratio {base / wall:5.1f}x"
        )


if __name__ == "__main__":
    main()
