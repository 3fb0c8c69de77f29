"""A cap on the tasks (processes and threads) one fork server and its jobs may hold together.

Two layers, because neither binds everywhere:
- a pids cgroup per fork server (cgroup v1 `pids` hierarchy, or a cgroup v2 child of our own cgroup
  with the pids controller), when this machine lets us create one: binds whoever we are;
- RLIMIT_NPROC in every job (sandbox/jail.py). The kernel counts it per user in the job's user
  namespace, so it binds the fork server's tasks together, but it is not enforced for tasks whose
  host uid is root, and bubblewrap maps the jobs' uid to the caller's. Without a cgroup, then, a
  root caller's jobs are uncapped: the pool says so once, loudly (`check`).
A raw `clone(CLONE_THREAD)` loop is the attack: without a cap it made 3,000 threads in 0.31 s.
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import time

log = logging.getLogger(__name__)

_V1 = "/sys/fs/cgroup/pids"
_V2_MOUNT = "/sys/fs/cgroup"


class PidsCgroup:
    """One cgroup that caps its members at `max_tasks` tasks; `wrap` starts a command inside it."""

    def __init__(self, path: str):
        self.path = path

    @classmethod
    def create(cls, max_tasks: int, tag: str) -> PidsCgroup | None:
        """A fresh cgroup under whichever pids hierarchy we may write to, or None (the reason logged at
        debug level; `check` reports what it means)."""
        name = f"hljax-{tag}-{os.getpid()}-{secrets.token_hex(4)}"
        for parent in _parents():
            path = os.path.join(parent, name)
            try:
                os.mkdir(path)
            except OSError as e:
                log.debug("no pids cgroup under %s: %s", parent, e)
                continue
            try:
                with open(os.path.join(path, "pids.max"), "w") as f:
                    f.write(str(max_tasks))
            except OSError as e:  # A v2 child without the pids controller has no pids.max.
                log.debug("cgroup %s takes no pids.max: %s", path, e)
                _rmdir(path)
                continue
            return cls(path)
        return None

    def wrap(self, argv: tuple[str, ...]) -> tuple[str, ...]:
        """`argv` run from a shell that first moves itself into the cgroup, so that every process
        the command ever starts is a member (no moment outside it, no preexec_fn in a threaded parent)."""
        procs = os.path.join(self.path, "cgroup.procs")
        return ("/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', procs, *argv)

    def remove(self) -> None:
        """Once its processes are gone (the fork server stopped)."""
        _rmdir(self.path)


def _parents() -> list[str]:
    out = []
    if os.path.isfile(os.path.join(_V1, "pids.max")) or os.path.isfile(os.path.join(_V1, "cgroup.procs")):
        out.append(_V1)
    own = _own_v2_cgroup()
    if own is not None and os.path.isfile(os.path.join(_V2_MOUNT, "cgroup.controllers")):
        out.append(os.path.join(_V2_MOUNT, own.lstrip("/")))
    return out


def _own_v2_cgroup() -> str | None:
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                if line.startswith("0::"):
                    return line[3:].strip()
    except OSError:
        pass
    return None


def _rmdir(path: str, wait_s: float = 2.0) -> None:
    # A killed namespace's last tasks leave the cgroup a moment after its first process was reaped.
    deadline = time.monotonic() + wait_s
    while True:
        try:
            os.rmdir(path)
            return
        except OSError as e:
            if e.errno != errno.EBUSY or time.monotonic() > deadline:
                log.warning("could not remove cgroup %s: %s", path, e)
                return
        time.sleep(0.02)


_warned = False


def check(cgroup: PidsCgroup | None, max_tasks: int) -> None:
    """Warn once per process when no layer caps the jobs' tasks (root caller, no pids cgroup)."""
    global _warned
    if cgroup is not None or os.geteuid() != 0 or _warned:
        return
    _warned = True
    log.warning(
        "sandbox: no pids cgroup could be created (%s not writable) and RLIMIT_NPROC does not bind root, so "
        "a job can start threads until the machine runs out of pids (max_tasks=%d is not enforced). Run as a "
        "non-root user, or give this process a writable pids cgroup.", " or ".join(_parents()) or "no pids "
        "hierarchy mounted", max_tasks)
