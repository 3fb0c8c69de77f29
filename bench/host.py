"""What host a bench ran on, and a guard against benching on a busy one.

Every bench prints `describe()` first and calls `check_idle` before measuring: a ratio against a
peer measured while other jobs hold cores says more about the other jobs than about either side.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import time

ISA_FLAGS = ("avx512f", "avx512_bf16", "amx_bf16", "amx_tile")

TORCH_REASON = ("ratios against torch peers are unreliable under load: torch's OpenMP threads wait for "
                "each other at every op, so one core taken by another job stalls them all")


def _cpuinfo() -> tuple[str, set[str]]:
    model, flags = "unknown CPU", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and model == "unknown CPU":
                    model = value.strip()
                elif key == "flags" and not flags:
                    flags = set(value.split())
    except OSError:  # Not Linux: describe what we can.
        pass
    return model, flags


def default_max_load(cpus: int | None = None) -> float:
    """Busy cores (see `busy_cores`) above which a host counts as busy: 0.25 + 0.05 per CPU.

    Not a fraction of the cores: a peer that runs one thread per core (torch) is held up by a single
    busy core, so the threshold stays well below one busy core on small hosts (0.35 on 2 CPUs); the
    small per-CPU term allows the daemons and kernel threads that larger hosts always show."""
    return 0.25 + 0.05 * (cpus or os.cpu_count() or 1)


def _cpu_times() -> tuple[int, int]:
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields[:8]), idle


def busy_cores(window: float = 1.0) -> float:
    """Cores kept busy by other work over the last `window` seconds (from /proc/stat; this process
    sleeps meanwhile). Unlike the load average, which lags by a minute, it sees a job that just
    started and forgets one that just ended; the 1-min load is printed beside it."""
    try:
        total0, idle0 = _cpu_times()
        time.sleep(window)
        total1, idle1 = _cpu_times()
    except (OSError, ValueError, IndexError):  # Not Linux: fall back on the load average.
        return os.getloadavg()[0]
    dt = max(total1 - total0, 1)
    return (os.cpu_count() or 1) * (1 - (idle1 - idle0) / dt)


def llc_bytes(default: int = 32 * 2**20) -> int:
    """The largest CPU cache's size in bytes (Linux sysfs), else `default`."""
    sizes = []
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes, default=default)


def describe() -> str:
    """One line: CPU model, CPU count, 1-min load, which of the ISA_FLAGS the CPU has."""
    model, flags = _cpuinfo()
    have = [f for f in ISA_FLAGS if f in flags]
    lack = [f for f in ISA_FLAGS if f not in flags]
    isa = " ".join(have) or "none"
    if lack:
        isa += f" (no {' '.join(lack)})"
    return (f"host: {model}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f} (1 min), "
            f"ISA {isa}")


def check_idle(max_load: float | None = None, allow: bool = False, reason: str = TORCH_REASON) -> float:
    """Warn loudly when other work keeps more than `max_load` cores busy (default `default_max_load()`),
    and exit unless `allow`. Returns the busy cores. A clean check at the start is necessary, not
    sufficient: nothing watches the host while the bench runs."""
    max_load = default_max_load() if max_load is None else max_load
    load = busy_cores()
    print(f"other work: {load:.2f} busy cores over the last second (threshold {max_load:.2f})", flush=True)
    if load > max_load:
        print(f"WARNING: {load:.2f} of {os.cpu_count()} CPUs busy with other work (> {max_load:.2f}): {reason}.",
              flush=True)
        if not allow:
            sys.exit(f"refusing to bench on a busy host ({load:.2f} busy cores > {max_load:.2f}); wait for the "
                     f"other jobs to finish, or pass --allow-load to measure anyway")
    return load


def add_args(parser: argparse.ArgumentParser) -> None:
    """--allow-load and --max-load, for `check_args`."""
    parser.add_argument("--allow-load", action="store_true",
                        help="measure even when the host's load says other work skews the peer")
    parser.add_argument("--max-load", type=float, default=None,
                        help=f"busy cores (other work) above which the host counts as busy (default {default_max_load():.2f})")


def check_args(args: argparse.Namespace, reason: str = TORCH_REASON) -> float:
    """Print `describe()`, then `check_idle` with the flags of `add_args`."""
    print(describe(), flush=True)
    return check_idle(args.max_load, args.allow_load, reason)
