"""The fork server: a warm, single-threaded process inside the sandbox that forks one child per job.

Runs inside the sandbox: standard library only. It holds no questions' answers, no
keys and no secrets: it only ever sees job numbers and the descriptors the supervisor hands it.
The harness code and the question go straight from the supervisor to the child over the child's
own job channel. Forking a warm interpreter costs a few milliseconds, against tens for a fresh one.

Started as `python -I -S -B -c "...; from sandbox.worker import main; main()" CONFIG_JSON` where
CONFIG_JSON holds: control_fd, tmp_root, limits (JobLimits fields), seccomp (the BPF program as hex
and its pid offsets), max_frames, max_answer_chars, preload (module names imported once here so
that children start with them), job_disk (JobDisk fields, or null: bare, work dirs in tmp_root),
slot_cgroup_fds (the `cgroup.procs` of one pids cgroup per job slot, or none) and become (the uid, gid
and capabilities to drop to first, when started as root of its user namespace: sandbox/isolation.py;
or null). Nothing imported here may register at-fork hooks (threading, random do): every child would
run them, at a cost of a hundred page faults or more each.

A job's exit is reported as soon as it is seen, before any clean-up: under bubblewrap there is none
here (each job's tmpfs dies with it, freed in its own process), and bare, the clean-up that follows
is bounded (`_CLEANUP_ENTRIES`), so no job's litter can hold up the kills and spawns of the others.
"""

from __future__ import annotations

import errno
import gc
import importlib
import json  # Only to read the startup config.
import os
import select
import signal
import socket
import sys
import traceback

from sandbox import jail, protocol, runner

# Bare (no per-job tmpfs): entries removed or entered per clean-up of a dead job's work dir, and per sweep of
# the work root. About 10 ms of this server's time at most; what is past it stays (bare is no sandbox).
_CLEANUP_ENTRIES = 5000


class ForkServer:
    """Serve `spawn` and `kill` requests from the supervisor until it closes the control channel."""

    def __init__(self, config: dict):
        self.config = config
        seccomp = config["seccomp"]
        disk = config.get("job_disk")
        self.jail = jail.Jail(
            jail.JobLimits(**config["limits"]), bytes.fromhex(seccomp["bpf"]), seccomp["pid_offsets"],
            jail.JobDisk(**disk) if disk else None,
        )
        self.own_disks = disk is not None
        self.control = socket.socket(fileno=config["control_fd"])
        # Plain epoll rather than selectors: after each fork every page this loop writes costs a
        # copy-on-write fault, and selectors' bookkeeping writes many.
        self.epoll = select.epoll()
        self.epoll.register(self.control.fileno(), select.EPOLLIN)
        self.children: dict[int, tuple[int, int, str, int]] = {}  # job -> (pid, pidfd, work dir, slot)
        self.by_pidfd: dict[int, int] = {}  # pidfd -> job
        # One pids cgroup per job slot: a slot is free again once its job's process is reaped, and so
        # are all of its threads.
        self.slot_fds: list[int] = list(config.get("slot_cgroup_fds") or ())
        self.free_slots = list(range(len(self.slot_fds)))[::-1]

    def serve(self) -> None:
        self.jail.harden_server()
        sys.stdout.reconfigure(line_buffering=True)  # Children inherit it: output reaches the tail even if a job dies.
        if not self.own_disks:
            root = self.config["tmp_root"]
            os.makedirs(root, exist_ok=True)
            # Held open before the root loses its read bit: the server lists it through this descriptor
            # (permissions are checked at open), jobs cannot list it at all. Jobs close it (Jail.confine).
            self.root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
            os.chmod(root, 0o300)
        for name in self.config["preload"]:
            importlib.import_module(name)
        gc.freeze()  # Keeps the collector from touching (and so copying) the server's pages in children.
        protocol.send_control(self.control, protocol.Control(protocol.READY, os.getpid()))
        try:
            control = self.control.fileno()
            while True:
                for fd, _ in self.epoll.poll():
                    if fd == control:
                        if not self._on_control():
                            return
                    else:
                        self._on_exit(self.by_pidfd.pop(fd))
        except (BrokenPipeError, ConnectionResetError):
            pass  # The supervisor went away: nobody to serve.
        finally:
            self._shutdown()

    def _on_control(self) -> bool:
        packet, fds = protocol.recv_control(self.control, max_fds=4)
        if packet is None:
            return False
        if packet.kind == protocol.SPAWN:
            self._spawn(packet.job, fds)
        elif packet.kind == protocol.KILL:
            entry = self.children.get(packet.job)
            if entry is not None:
                _kill(entry[1])
        return True

    def _spawn(self, job: int, fds: list[int]) -> None:
        if self.own_disks:  # Every job has its own tmpfs on the same path, seen by it alone.
            work_dir = self.config["tmp_root"]
        else:  # An unguessable name: jobs share the root, and a job could otherwise create the next job's dir first.
            work_dir = f"{self.config['tmp_root']}/{job}-{os.urandom(8).hex()}"
        if self.slot_fds and not self.free_slots:
            self._spawn_failed(job, fds, errno.EBUSY)  # The supervisor never sends more jobs than slots.
            return
        slot = self.free_slots.pop() if self.slot_fds else -1
        try:
            pid = os.fork()
        except OSError as e:
            if slot >= 0:
                self.free_slots.append(slot)
            self._spawn_failed(job, fds, e.errno or 0)
            return
        if pid == 0:
            self._child(fds, work_dir, self.slot_fds[slot] if slot >= 0 else -1)
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        self.children[job] = (pid, pidfd, work_dir, slot)
        self.by_pidfd[pidfd] = job
        self.epoll.register(pidfd, select.EPOLLIN)

    def _spawn_failed(self, job: int, fds: list[int], error: int) -> None:
        for fd in fds:
            os.close(fd)
        protocol.send_control(self.control, protocol.Control(protocol.SPAWN_FAILED, job, error))

    def _child(self, fds: list[int], work_dir: str, cgroup_fd: int) -> None:
        """In the forked child: confine, run the job, never return."""
        try:
            self.jail.confine(fds, work_dir, cgroup_fd)
            runner.run_job(jail.JOB_IN_FD, jail.JOB_OUT_FD, self.config["max_frames"], self.config["max_answer_chars"])
        except BaseException:  # noqa: BLE001 - report our own failure on stderr, then exit non-zero.
            try:
                os.write(2, traceback.format_exc().encode()[-4000:])
            finally:
                os._exit(4)
        os._exit(5)  # run_job exits by itself; reaching here is a bug.

    def _on_exit(self, job: int) -> None:
        pid, pidfd, work_dir, slot = self.children.pop(job)
        # Explicitly: a child forked meanwhile may still hold a copy, which would keep it registered.
        self.epoll.unregister(pidfd)
        os.close(pidfd)
        _, status, usage = os.wait4(pid, 0)
        if slot >= 0:
            self.free_slots.append(slot)
        # Reported first: the supervisor's kill grace and the job's result never wait on a clean-up.
        protocol.send_control(self.control, protocol.Control(protocol.EXITED, job, status, usage.ru_maxrss))
        if not self.own_disks:
            jail.remove_tree(work_dir, _CLEANUP_ENTRIES)
            self._sweep()

    def _sweep(self) -> None:
        """Bare: remove what no live job owns from the work root, a bounded amount per exit: a job may
        write beside its own work dir, and that must not outlive it (filling the disk for later jobs)."""
        live = {os.path.basename(w) for _, _, w, _ in self.children.values()}
        budget = _CLEANUP_ENTRIES
        with os.scandir(self.root_fd) as entries:
            names = [e.name for _, e in zip(range(budget), entries) if e.name not in live]
        for name in names:
            jail.remove_tree(f"{self.config['tmp_root']}/{name}", max(1, budget // len(names)))

    def _shutdown(self) -> None:
        for pid, pidfd, _, _ in self.children.values():
            _kill(pidfd)
            os.waitpid(pid, 0)


def _kill(pidfd: int) -> None:
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except ProcessLookupError:  # Already exited, not yet reaped: its exit is reported anyway.
        pass


def main() -> None:
    config = json.loads(sys.argv[1])
    if config.get("become"):  # Started as root of its user namespace (host root): first, drop that.
        become = config["become"]
        jail.become(become["uid"], become["gid"], tuple(become["keep"]))
    ForkServer(config).serve()
