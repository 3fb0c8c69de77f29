"""A cap on the tasks (processes and threads) one fork server and its jobs may hold together, and on
each job's own.

Two layers, because neither binds everywhere:
- a pids cgroup per fork server (cgroup v1 `pids` hierarchy, or a cgroup v2 child of our own cgroup
  with the pids controller), when this machine lets us create one: binds whoever we are. Inside it,
  `server` holds the fork server (and bubblewrap) and `s0`, `s1`, ... one job slot each, with a cap
  of its own: a job moves itself into its slot's cgroup before any harness code runs (jail.confine,
  through a descriptor the fork server inherits; no cgroup path is visible in the sandbox), so a
  thread flood stops at its own cap, and the slots' caps sum to less than the fork server's, which
  always keeps room to fork the next job;
- RLIMIT_NPROC in every job (sandbox/jail.py). The kernel counts it per user in the job's user
  namespace, so it binds the fork server's tasks together, but it is not enforced for tasks whose
  host uid is root: jobs that run as root underneath (isolation="rlimits_only" as root, or
  $HLJAX_SANDBOX_HOST_UID=caller: sandbox/isolation.py) are uncapped without a cgroup, and the pool
  says so once, loudly (`check`). By default a root caller's jobs run as an unprivileged host uid.
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
    """One cgroup that caps its members at `max_tasks` tasks, with a leaf for the fork server and one
    capped leaf per job slot; `wrap` starts a command in the server's leaf."""

    def __init__(self, path: str, slots: int):
        self.path = path
        self.server = os.path.join(path, "server")
        self.slots = [os.path.join(path, f"s{k}") for k in range(slots)]

    @classmethod
    def create(cls, max_tasks: int, tag: str, slots: int = 0, slot_tasks: int = 0) -> PidsCgroup | None:
        """A fresh cgroup under whichever pids hierarchy we may write to, or None (the reason logged at
        debug level; `check` reports what it means). `slots` leaves capped at `slot_tasks` each."""
        name = f"hljax-{tag}-{os.getpid()}-{secrets.token_hex(4)}"
        for parent in _parents():
            path = os.path.join(parent, name)
            try:
                os.mkdir(path)
            except OSError as e:
                log.debug("no pids cgroup under %s: %s", parent, e)
                continue
            try:
                _write(os.path.join(path, "pids.max"), str(max_tasks))
            except OSError as e:  # A v2 child without the pids controller has no pids.max.
                log.debug("cgroup %s takes no pids.max: %s", path, e)
                _rmdir(path)
                continue
            group = cls(path, slots)
            try:
                group._make_leaves(slot_tasks)
            except OSError as e:  # We could make the parent, so this is unexpected: say so, and go without.
                log.warning("sandbox: pids cgroup %s: could not make its leaves (%s); no pids cgroup for this "
                            "fork server", path, e)
                group.remove(wait_s=0.5)
                continue
            return group
        return None

    def _make_leaves(self, slot_tasks: int) -> None:
        # cgroup v2 keeps processes out of a cgroup whose children use a controller: enable pids for the
        # leaves. (v1 has no such file and no such rule.)
        control = os.path.join(self.path, "cgroup.subtree_control")
        if os.path.exists(control):
            _write(control, "+pids")
        os.mkdir(self.server)
        for slot in self.slots:
            os.mkdir(slot)
            _write(os.path.join(slot, "pids.max"), str(slot_tasks))

    def wrap(self, argv: tuple[str, ...]) -> tuple[str, ...]:
        """`argv` run from a shell that first moves itself into the server's leaf, so that every process
        the command ever starts is a member (no moment outside it, no preexec_fn in a threaded parent)."""
        procs = os.path.join(self.server, "cgroup.procs")
        return ("/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', procs, *argv)

    def open_slots(self) -> list[int]:
        """A write descriptor on each slot's `cgroup.procs`, for the fork server to inherit (close ours
        once it is started): a job joins its slot by writing "0" to it."""
        return [os.open(os.path.join(slot, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC) for slot in self.slots]

    def remove(self, wait_s: float = 2.0) -> bool:
        """Once its processes are gone (the fork server stopped). False if some leaf is still busy after
        `wait_s` (a killed namespace's last tasks leave it a moment after its first process was reaped):
        call again later."""
        done = True
        for path in [*self.slots, self.server, self.path]:
            done = _rmdir(path, wait_s, quiet=wait_s == 0) and done
        return done


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


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _rmdir(path: str, wait_s: float = 2.0, quiet: bool = False) -> bool:
    """True once `path` is gone. Busy after `wait_s`: a warning unless `quiet` (the caller retries)."""
    # A killed namespace's last tasks leave the cgroup a moment after its first process was reaped.
    deadline = time.monotonic() + wait_s
    while True:
        try:
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return True
        except OSError as e:
            if e.errno != errno.EBUSY or time.monotonic() >= deadline:
                if not (quiet and e.errno == errno.EBUSY):
                    log.warning("could not remove cgroup %s: %s", path, e)
                return False
        time.sleep(0.02)


_warned = False


def check(cgroup: PidsCgroup | None, max_tasks: int, job_host_uid: int) -> None:
    """Warn once per process when no layer caps the jobs' tasks (jobs are host root, no pids cgroup)."""
    global _warned
    if cgroup is not None or job_host_uid != 0 or _warned:
        return
    _warned = True
    log.warning(
        "sandbox: no pids cgroup could be created (%s not writable) and RLIMIT_NPROC does not bind root, so "
        "a job can start threads until the machine runs out of pids (max_tasks=%d is not enforced). Run the "
        "jobs as a non-root host uid (the default under bwrap), or give this process a writable pids cgroup.",
        " or ".join(_parents()) or "no pids hierarchy mounted", max_tasks)
