"""Restrictions a job process applies to itself right after fork, before any harness code runs.

Runs inside the sandbox: standard library only (hljax is not importable there). The order matters:
descriptors and limits first, the seccomp filter last, because the filter forbids some of the
calls that the earlier steps make.

Everything a child needs is prepared once in the fork server (`Jail`): on this kind of machine each
page a child touches first costs a copy-on-write fault, so per-child work is kept to syscalls.
The seccomp program arrives ready-made from the supervisor (`sandbox.seccomp`), so this side
needs neither pyseccomp nor ctypes.util, which would import threading and its at-fork hooks.
"""

from __future__ import annotations

import ctypes
import dataclasses
import fcntl
import os
import resource
import signal
import struct

# A job process's descriptors: 0-2 are stdin (/dev/null), stdout, stderr; then the job channel.
JOB_IN_FD = 3  # Messages from the supervisor.
JOB_OUT_FD = 4  # Messages to the supervisor.

_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_PR_SET_SECCOMP = 22
_PR_SET_NO_NEW_PRIVS = 38
_SECCOMP_MODE_FILTER = 2
INSN = struct.Struct("=HBBI")  # struct sock_filter: code, jt, jf, k


@dataclasses.dataclass(frozen=True)
class JobLimits:
    """Per-job kernel limits, set with setrlimit in the job process (soft = hard)."""

    address_space_bytes: int  # RLIMIT_AS: a memory bomb gets MemoryError; thread stacks count too.
    cpu_seconds: int  # RLIMIT_CPU: backstop only; the supervisor's wall-clock deadline is the real one.
    file_size_bytes: int  # RLIMIT_FSIZE: largest file a job may write in its work dir.
    open_files: int  # RLIMIT_NOFILE.
    # RLIMIT_NPROC, or None. Counted per user in the job's user namespace, so under bubblewrap it caps
    # the fork server's tasks together; not enforced when the host uid is root (sandbox/pids.py).
    tasks: int | None = None


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class Jail:
    """Built once in the fork server; `confine` turns each freshly forked child into a job process.

    `program` is the seccomp BPF; `pid_offsets` are the byte offsets of the instructions whose
    operand is the job's own pid (the only allowed signal target), written in per child.
    """

    def __init__(self, limits: JobLimits, program: bytes, pid_offsets: list[int]):
        self._prctl = ctypes.CDLL(None, use_errno=True).prctl
        self._prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4  # Addresses must not be cut to int.
        if not pid_offsets or len(program) % INSN.size:
            raise ValueError("malformed seccomp program")
        self._pid_operands = [off + 4 for off in pid_offsets]  # Byte offset of `k` in each instruction.
        self._program = ctypes.create_string_buffer(program, len(program))
        self._fprog = _SockFprog(len(program) // INSN.size, ctypes.addressof(self._program))
        self._fprog_address = ctypes.addressof(self._fprog)
        self._max_fd = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        self._rlimits = (
            (resource.RLIMIT_AS, (limits.address_space_bytes,) * 2),
            (resource.RLIMIT_CPU, (limits.cpu_seconds,) * 2),
            (resource.RLIMIT_FSIZE, (limits.file_size_bytes,) * 2),
            (resource.RLIMIT_NOFILE, (limits.open_files,) * 2),
            (resource.RLIMIT_CORE, (0, 0)),
        ) + (((resource.RLIMIT_NPROC, (limits.tasks,) * 2),) if limits.tasks is not None else ())

    def prctl(self, option: int, value: int) -> None:
        if self._prctl(option, value, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), f"prctl({option}, {value}) failed")

    def harden_server(self) -> None:
        """Once, in the fork server. Both flags are inherited by every child it forks."""
        self.prctl(_PR_SET_DUMPABLE, 0)  # /proc/<pid>/mem etc. closed to other jobs (same uid).
        self.prctl(_PR_SET_NO_NEW_PRIVS, 1)  # Required to load a seccomp filter without privileges.

    def confine(self, fds: list[int], work_dir: str) -> None:
        """Must run in the child before any harness code. `fds`: job in, job out, stdout, stderr.

        Leaves exactly: fd 0 = /dev/null, 1/2 = the output pipes, JOB_IN_FD / JOB_OUT_FD = the channel.
        Signal dispositions stay Python's defaults, as the fork server never changes them.
        """
        os.setsid()  # Its own session and process group: kill(0, sig) reaches nobody else.
        # Die with the fork server; under bubblewrap the pid namespace does that too, bare it is the only way.
        self.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        # First above the targets, so that no dup2 below overwrites a descriptor still to be moved.
        job_in, job_out, stdout_fd, stderr_fd = (fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in fds)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(stdout_fd, 1)
        os.dup2(stderr_fd, 2)
        os.dup2(job_in, JOB_IN_FD)
        os.dup2(job_out, JOB_OUT_FD)
        os.closerange(JOB_OUT_FD + 1, self._max_fd)
        os.mkdir(work_dir, 0o700)
        os.chdir(work_dir)
        for res, value in self._rlimits:
            resource.setrlimit(res, value)
        # The filter, with this process as the only allowed signal target, for good.
        pid = os.getpid()
        for at in self._pid_operands:
            struct.pack_into("=I", self._program, at, pid)
        if self._prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, self._fprog_address, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def remove_tree(path: str, max_steps: int = 1_000_000) -> None:
    """Remove a dead job's work dir, best effort, and never raise.

    Iterative, one descriptor open at a time, relative to it: no nesting depth can exhaust the
    recursion limit (shutil.rmtree raised RecursionError past ~1,000 levels), descriptors or PATH_MAX.
    What cannot be removed (a dir the job made unreadable and that stays so) is left in the tmpfs,
    whose size is capped."""
    try:
        os.rmdir(path)  # The common case: the job wrote no files.
        return
    except OSError:
        pass
    try:
        os.unlink(path)  # A file a job left beside its work dir.
        return
    except OSError:
        pass
    try:
        os.chmod(path, 0o700, follow_symlinks=False)  # A dir a job made with no read bit.
        fd = os.open(path, _DIR_FLAGS)
    except (OSError, NotImplementedError):  # NotImplementedError: chmod of a symlink on Linux.
        return
    names: list[str] = []  # From `path` down to the dir `fd` is open on.
    try:
        for _ in range(max_steps):
            child = None
            with os.scandir(fd) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        child = entry.name
                        break
                    try:
                        os.unlink(entry.name, dir_fd=fd)
                    except OSError:
                        pass
            if child is not None:
                try:
                    os.chmod(child, 0o700, dir_fd=fd, follow_symlinks=False)
                    sub = os.open(child, _DIR_FLAGS, dir_fd=fd)
                except OSError:
                    return  # Cannot go down: give up rather than loop on it.
                os.close(fd)
                fd, _ = sub, names.append(child)
                continue
            if not names:
                break
            parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = parent
            os.rmdir(names.pop(), dir_fd=fd)
    except OSError:
        return
    finally:
        os.close(fd)
    try:
        os.rmdir(path)
    except OSError:
        pass
