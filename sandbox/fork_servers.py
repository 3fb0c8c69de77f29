"""The pool's fork servers (`sandbox.worker`, one process each): starting them, replacing a dead one
in the background with backoff, and their pids cgroups.

`SandboxPool` (pool.py) owns one `ForkServers` and runs jobs on its `slots`; it decides when a fork
server must go (`SandboxPool._replace_worker`) and what becomes of the jobs it held. Here: how a slot
gets a fork server again. A replacement is launched without waiting for it; the pool's loop hands its
control-channel events to `on_ready` / `abandon_start`, and calls `tend` each pass to start what is due
and to give up on starts past their deadline. A start that fails is tried again after 0.5 s, 1 s, 2 s,
... up to 30 s, with one warning line each time, while the other fork servers keep serving.
"""

from __future__ import annotations

import logging
import math
import os
import selectors
import socket
import subprocess
import tempfile
import time

from sandbox import isolation, pids, protocol
from sandbox.config import SandboxConfig

log = logging.getLogger("sandbox.pool")  # The pool's log, as before these moved out of pool.py.

# A fork server that could not be started is tried again after 0.5 s, 1 s, 2 s, ... up to 30 s.
_RETRY_FIRST_S = 0.5
_RETRY_MAX_S = 30.0


class ForkServer:
    """One fork server process and the control channel to it; `ready` once it said so."""

    def __init__(self, index: int, proc: subprocess.Popen, control: socket.socket, log_file,
                 cgroup: pids.PidsCgroup | None, start_deadline: float):  # fmt: skip
        self.index = index
        self.proc = proc
        self.control = control
        self.log_file = log_file  # The fork server's own stderr, for the reason when it dies.
        self.cgroup = cgroup  # Caps the tasks of the fork server and of each of its jobs (sandbox/pids.py).
        self.runs: set[int] = set()  # Keys of the job runs it holds now.
        self.ready = False
        self.start_deadline = start_deadline

    def log_tail(self, n: int = 2000) -> str:
        self.log_file.seek(0)
        return self.log_file.read().decode("utf-8", "replace")[-n:].strip()

    def kill(self) -> None:
        """SIGKILL bubblewrap (or the bare server): its pid namespace, and every job in it, go with it."""
        self.proc.kill()
        self.proc.wait()

    def stop(self, cgroup_wait_s: float) -> bool:
        """Close up after the process ended or was asked to (closing the control channel does); False
        if its cgroup is still busy after `cgroup_wait_s` (remove it later)."""
        self.control.close()
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.kill()
        self.log_file.close()
        return self.cgroup is None or self.cgroup.remove(wait_s=cgroup_wait_s)


class ForkServers:
    """`config.workers` slots, each holding a `ForkServer` or None while its start is due. Control
    channels are registered in `selector` with the data ("control", server)."""

    def __init__(self, config: SandboxConfig, selector: selectors.BaseSelector):
        self.config = config
        self._selector = selector
        self._tmp = tempfile.TemporaryDirectory(prefix="hljax-sandbox-") if config.isolation == "rlimits_only" else None
        self.slots: list[ForkServer | None] = [None] * config.workers
        self._retry_at = [math.inf] * config.workers  # When to start a slot that has no fork server.
        self._failed_starts = [0] * config.workers  # Consecutive failed starts, for the backoff.
        self.last_failure = ""  # Why the last start failed, for jobs that find no fork server at all.
        self.down_since: float | None = None  # Since when no fork server is ready.
        self._stale_cgroups: list[pids.PidsCgroup] = []  # Of dead fork servers, still busy when they died.
        self.closed = False

    @property
    def capacity(self) -> int:
        """Fork servers ready to take jobs."""
        return sum(1 for w in self.slots if w is not None and w.ready)

    def _launch(self, index: int) -> ForkServer:
        """Start fork server `index`; it is not ready until it says so on its control channel."""
        config = self.config
        job_uid = isolation.job_host_uid(config)  # First: it refuses a malformed $HLJAX_SANDBOX_HOST_UID.
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        cgroup = pids.PidsCgroup.create(config.max_tasks, f"w{index}", config.slots_per_worker, config.job_tasks)
        pids.check(cgroup, config.max_tasks, job_uid)
        slot_fds = tuple(cgroup.open_slots()) if cgroup is not None else ()
        spec = None
        try:
            if config.isolation == "bwrap":
                spec = isolation.bwrap_launch(config, theirs.fileno(), slot_fds)
            else:
                tmp_root = os.path.join(self._tmp.name, str(index))
                spec = isolation.bare_launch(config, theirs.fileno(), tmp_root, slot_fds)
            log_file = tempfile.TemporaryFile()
            argv = cgroup.wrap(spec.argv) if cgroup is not None else spec.argv
            proc = subprocess.Popen(
                argv, env=spec.env, pass_fds=(theirs.fileno(), *slot_fds, *spec.fds), stdin=subprocess.DEVNULL,
                stdout=log_file, stderr=log_file, start_new_session=True,
            )  # fmt: skip
        except BaseException:
            ours.close()
            if cgroup is not None:
                cgroup.remove(wait_s=0)
            raise
        finally:
            theirs.close()
            for fd in slot_fds + (spec.fds if spec is not None else ()):
                os.close(fd)
        return ForkServer(index, proc, ours, log_file, cgroup, time.monotonic() + config.start_timeout_s)

    def start_all(self) -> None:
        """Launch every fork server in parallel and wait for each to report ready (the pool's first
        start); SandboxUnavailable, with the failing one's log, if one does not."""
        workers = []
        try:
            for i in range(self.config.workers):
                workers.append(self._launch(i))
        except BaseException:
            for x in workers:
                x.kill()
                x.stop(cgroup_wait_s=2.0)
            raise
        for w in workers:
            w.control.settimeout(max(0.01, w.start_deadline - time.monotonic()))
            try:
                packet, _ = protocol.recv_control(w.control)
            except (TimeoutError, OSError, protocol.ProtocolError) as e:
                packet = None
                log.error("sandbox worker %d did not start: %s", w.index, e)
            if packet is None or packet.kind != protocol.READY:
                tail = w.log_tail()
                for x in workers:
                    x.kill()
                    x.stop(cgroup_wait_s=2.0)
                raise isolation.SandboxUnavailable(f"sandbox worker failed to start: {tail or 'no output'}")
        for w in workers:
            w.control.setblocking(False)
            w.ready = True
            self._selector.register(w.control, selectors.EVENT_READ, ("control", w))
            self.slots[w.index] = w

    def begin_start(self, index: int) -> None:
        """Start a replacement for slot `index` without waiting for it: `on_ready` sees it ready."""
        self._retry_at[index] = math.inf
        try:
            worker = self._launch(index)
        except (isolation.SandboxUnavailable, OSError) as e:
            self._start_failed(index, f"{type(e).__name__}: {e}")
            return
        worker.control.setblocking(False)
        self.slots[index] = worker
        self._selector.register(worker.control, selectors.EVENT_READ, ("control", worker))

    def on_ready(self, worker: ForkServer) -> None:
        worker.ready = True
        if self._failed_starts[worker.index]:
            log.warning("sandbox worker %d is back after %d failed start(s); %d of %d fork servers running",
                        worker.index, self._failed_starts[worker.index], self.capacity, self.config.workers)
        self._failed_starts[worker.index] = 0

    def abandon_start(self, worker: ForkServer, why: str) -> None:
        """A replacement that died or never said ready: kill it and try again later."""
        self._selector.unregister(worker.control)
        worker.kill()
        tail = worker.log_tail()
        self.retire(worker)
        self._start_failed(worker.index, why + (f"; its log: {tail[-300:]}" if tail else ""))

    def _start_failed(self, index: int, why: str) -> None:
        """Schedule the next try of slot `index` and say so, in one line."""
        self._failed_starts[index] += 1
        tries = self._failed_starts[index]
        delay = min(_RETRY_FIRST_S * 2 ** (tries - 1), _RETRY_MAX_S)
        self._retry_at[index] = time.monotonic() + delay
        self.last_failure = why
        log.warning("sandbox worker %d could not be started (try %d: %s); next try in %.1f s; %d of %d fork "
                    "servers running", index, tries, why, delay, self.capacity, self.config.workers)

    def retire(self, worker: ForkServer) -> None:
        """Close up a killed fork server; its cgroup goes later if its last tasks are still leaving."""
        if not worker.stop(cgroup_wait_s=0):
            self._stale_cgroups.append(worker.cgroup)
        if self.slots[worker.index] is worker:
            self.slots[worker.index] = None

    def tend(self, now: float) -> None:
        """Start what is due, give up on starts past their deadline, remove cgroups freed since."""
        for i, worker in enumerate(self.slots):
            if worker is None and now >= self._retry_at[i] and not self.closed:
                self.begin_start(i)
            elif worker is not None and not worker.ready and now > worker.start_deadline:
                self.abandon_start(worker, f"it did not report ready within {self.config.start_timeout_s:g}s")
        self._stale_cgroups = [g for g in self._stale_cgroups if not g.remove(wait_s=0)]
        if self.capacity:
            self.down_since = None
        elif self.down_since is None:
            self.down_since = now

    def next_event(self, now: float) -> float:
        """Seconds until `tend` has something to do."""
        times = [t for t, w in zip(self._retry_at, self.slots) if w is None]
        times += [w.start_deadline for w in self.slots if w is not None and not w.ready]
        return max(0.0, min(times, default=math.inf) - now)

    def close(self) -> None:
        """Stop every fork server (the pool's close). Idempotent."""
        if self.closed:
            return
        self.closed = True
        for w in self.slots:
            if w is not None:
                self._selector.unregister(w.control)
                if not w.ready:
                    w.kill()
                w.stop(cgroup_wait_s=2.0)
        for group in self._stale_cgroups:
            group.remove(wait_s=2.0)
        if self._tmp is not None:
            self._tmp.cleanup()
