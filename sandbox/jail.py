"""Restrictions a job process applies to itself right after fork, before any harness code runs.

Runs inside the sandbox: standard library only (hljax is not importable there). The order matters:
the job's own pids cgroup and tmpfs first (they need the fork server's descriptors and capability),
then descriptors, limits and capabilities, the seccomp filter last, because the filter forbids some
of the calls that the earlier steps make.

Everything a child needs is prepared once in the fork server (`Jail`): on this kind of machine each
page a child touches first costs a copy-on-write fault, so per-child work is kept to syscalls.
The seccomp program arrives ready-made from the supervisor (`sandbox.seccomp`), so this side
needs neither pyseccomp nor ctypes.util, which would import threading and its at-fork hooks.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
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
_PR_SET_KEEPCAPS = 8
_PR_CAPBSET_DROP = 24
_PR_SET_SECCOMP = 22
_PR_SET_NO_NEW_PRIVS = 38
_SECCOMP_MODE_FILTER = 2
INSN = struct.Struct("=HBBI")  # struct sock_filter: code, jt, jf, k
_CLONE_NEWNS = 0x00020000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 0x2, 0x4, 0x8
_CAPABILITY_VERSION_3 = 0x20080522
CAP_SYS_ADMIN = 21
_CAP_SETPCAP = 8


@dataclasses.dataclass(frozen=True)
class JobLimits:
    """Per-job kernel limits, set with setrlimit in the job process (soft = hard)."""

    address_space_bytes: int  # RLIMIT_AS: a memory bomb gets MemoryError; thread stacks count too.
    cpu_seconds: int  # RLIMIT_CPU: backstop only; the supervisor's wall-clock deadline is the real one.
    file_size_bytes: int  # RLIMIT_FSIZE: largest file a job may write in its work dir.
    open_files: int  # RLIMIT_NOFILE.
    # RLIMIT_NPROC, or None. Counted per user in the job's user namespace, so under bubblewrap it caps
    # the fork server's tasks together; not enforced when the job's host uid is root (sandbox/pids.py).
    tasks: int | None = None


@dataclasses.dataclass(frozen=True)
class JobDisk:
    """Each job's own tmpfs (under bubblewrap): mounted on its work dir in a mount namespace of its
    own, so no other job can see it, its files count against its own size and inode caps only, and
    the kernel frees it when the job's last process exits, in that process: nobody else pays for it."""

    size_bytes: int
    inodes: int  # Files and directories together: bounds the kernel memory a job can pin, and freeing it.


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


class Jail:
    """Built once in the fork server; `confine` turns each freshly forked child into a job process.

    `program` is the seccomp BPF; `pid_offsets` are the byte offsets of the instructions whose
    operand is the job's own pid (the only allowed signal target), written in per child.
    """

    def __init__(self, limits: JobLimits, program: bytes, pid_offsets: list[int], disk: JobDisk | None = None):
        libc = ctypes.CDLL(None, use_errno=True)
        self._prctl = libc.prctl
        self._prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4  # Addresses must not be cut to int.
        self._libc = libc
        self._disk = disk
        if disk is not None:
            self._mount_options = f"size={disk.size_bytes},nr_inodes={disk.inodes},mode=0700".encode()
        # capset with every set empty: prepared here, so that a child only makes the call.
        self._cap_header = _CapHeader(_CAPABILITY_VERSION_3, 0)
        self._cap_data = (_CapData * 2)()
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

    def confine(self, fds: list[int], work_dir: str, cgroup_fd: int = -1) -> None:
        """Must run in the child before any harness code. `fds`: job in, job out, stdout, stderr;
        `cgroup_fd`: the `cgroup.procs` of the job's own pids cgroup, or -1.

        Leaves exactly: fd 0 = /dev/null, 1/2 = the output pipes, JOB_IN_FD / JOB_OUT_FD = the channel;
        no capabilities. Signal dispositions stay Python's defaults, as the fork server never changes them.
        """
        os.setsid()  # Its own session and process group: kill(0, sig) reaches nobody else.
        # Die with the fork server; under bubblewrap the pid namespace does that too, bare it is the only way.
        self.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if cgroup_fd >= 0:
            # "0" is the writer: from here on every thread the job starts counts against its own cap.
            os.write(cgroup_fd, b"0")
        # First above the targets, so that no dup2 below overwrites a descriptor still to be moved.
        job_in, job_out, stdout_fd, stderr_fd = (fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in fds)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(stdout_fd, 1)
        os.dup2(stderr_fd, 2)
        os.dup2(job_in, JOB_IN_FD)
        os.dup2(job_out, JOB_OUT_FD)
        os.closerange(JOB_OUT_FD + 1, self._max_fd)
        if self._disk is not None:
            self._mount_own_disk(work_dir)
        else:
            os.mkdir(work_dir, 0o700)
        os.chdir(work_dir)
        for res, value in self._rlimits:
            resource.setrlimit(res, value)
        self._drop_capabilities()
        # The filter, with this process as the only allowed signal target, for good.
        pid = os.getpid()
        for at in self._pid_operands:
            struct.pack_into("=I", self._program, at, pid)
        if self._prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, self._fprog_address, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")

    def _mount_own_disk(self, work_dir: str) -> None:
        """A mount namespace of the job's own (the fork server's mounts, locked read-only as they came
        from bubblewrap's) with a fresh, capped tmpfs on `work_dir`, covering it for this job only."""
        if self._libc.unshare(_CLONE_NEWNS) != 0:
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS) failed: the fork server needs CAP_SYS_ADMIN")
        flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
        if self._libc.mount(b"tmpfs", work_dir.encode(), b"tmpfs", flags, self._mount_options) != 0:
            raise OSError(ctypes.get_errno(), f"mounting the job's tmpfs on {work_dir} failed")

    def _drop_capabilities(self) -> None:
        """Empty effective, permitted and inheritable sets (the ambient set follows). Under bubblewrap the
        fork server keeps CAP_SYS_ADMIN in its user namespace to mount each job's tmpfs; no job keeps it."""
        if self._libc.capset(ctypes.byref(self._cap_header), self._cap_data) != 0:
            raise OSError(ctypes.get_errno(), "capset failed")


def become(uid: int, gid: int, keep: tuple[int, ...] = ()) -> None:
    """First thing in a fork server or the scorer process that bubblewrap started as root of a user
    namespace made for it (sandbox/isolation.py): become `uid` and `gid`, which that namespace maps to an
    unprivileged host uid, with no supplementary group and no capability but `keep`, in every set, the
    bounding set included. bubblewrap leaves it CAP_SETUID, CAP_SETGID and CAP_SETPCAP for this only.
    Raises (the process then never reports ready) unless the result is exactly that."""
    libc = ctypes.CDLL(None, use_errno=True)
    prctl = libc.prctl
    prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
    # The bounding set first, while CAP_SETPCAP is effective; CAP_SETPCAP itself last.
    for cap in [c for c in range(64) if c not in keep and c != _CAP_SETPCAP] + [_CAP_SETPCAP]:
        if prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() != errno.EINVAL:  # EINVAL: no such cap.
            raise OSError(ctypes.get_errno(), f"prctl(PR_CAPBSET_DROP, {cap}) failed")
    os.setgroups([])  # Root's supplementary groups (gid 0 is host root's group) go.
    os.setresgid(gid, gid, gid)
    if prctl(_PR_SET_KEEPCAPS, 1 if keep else 0, 0, 0, 0) != 0:  # Else the uid change empties every set.
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_KEEPCAPS) failed")
    os.setresuid(uid, uid, uid)
    prctl(_PR_SET_KEEPCAPS, 0, 0, 0, 0)
    mask = sum(1 << cap for cap in keep)
    data = (_CapData * 2)()
    for i in range(2):
        data[i].effective = data[i].permitted = (mask >> (32 * i)) & 0xFFFFFFFF
    if libc.capset(ctypes.byref(_CapHeader(_CAPABILITY_VERSION_3, 0)), data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")
    with open("/proc/self/status") as f:
        status = dict(line.split(":", 1) for line in f if ":" in line)
    caps = {k: int(status[k], 16) for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")}
    want = {"CapInh": 0, "CapPrm": mask, "CapEff": mask, "CapBnd": mask, "CapAmb": 0}
    ids = (os.getresuid(), os.getresgid(), os.getgroups())
    if caps != want or ids != ((uid,) * 3, (gid,) * 3, []):
        raise RuntimeError(f"dropping root failed: {ids}, capabilities {caps}, wanted {want}")


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def remove_tree(path: str, max_entries: int = 1_000_000) -> bool:
    """Remove a dead job's work dir, best effort, and never raise; True when it is gone.

    Iterative, one descriptor open at a time, relative to it: no nesting depth can exhaust the
    recursion limit (shutil.rmtree raised RecursionError past ~1,000 levels), descriptors or PATH_MAX.
    At most `max_entries` entries are removed or entered, so the cost to the caller is bounded
    whatever the job left. What is not removed (a dir the job made unreadable and that stays so, or
    what is past the bound) is left in place."""
    try:
        os.rmdir(path)  # The common case: the job wrote no files.
        return True
    except OSError:
        pass
    try:
        os.unlink(path)  # A file a job left beside its work dir.
        return True
    except OSError:
        pass
    try:
        os.chmod(path, 0o700, follow_symlinks=False)  # A dir a job made with no read bit.
        fd = os.open(path, _DIR_FLAGS)
    except (OSError, NotImplementedError):  # NotImplementedError: chmod of a symlink on Linux.
        return False
    budget = [max_entries]
    try:
        if not _empty_tree(fd, budget):
            return False
    finally:
        os.close(fd)
    try:
        os.rmdir(path)
    except OSError:
        return False
    return True


def _empty_tree(fd: int, budget: list[int]) -> bool:
    """Remove everything below the dir open on `fd` (which stays open), spending `budget[0]`."""
    names: list[str] = []  # From the top down to the dir `fd` is open on.
    top = fd
    try:
        while budget[0] > 0:
            child = None
            with os.scandir(fd) as entries:
                for entry in entries:
                    budget[0] -= 1
                    if budget[0] <= 0:
                        return False
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
                    return False  # Cannot go down: give up rather than loop on it.
                if fd != top:
                    os.close(fd)
                fd, _ = sub, names.append(child)
                continue
            if not names:
                return True
            parent = top if len(names) == 1 else os.open("..", _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = parent
            os.rmdir(names.pop(), dir_fd=fd)
        return False
    except OSError:
        return False
    finally:
        if fd != top:
            os.close(fd)
