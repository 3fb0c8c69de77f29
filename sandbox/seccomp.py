"""The job processes' seccomp filter, generated on the trusted side and shipped to fork servers as BPF.

Generating it needs pyseccomp (libseccomp through ctypes.util, which imports threading and
subprocess); doing that here keeps those modules, and their at-fork hooks, out of fork servers.
"""

from __future__ import annotations

import dataclasses
import errno
import os

import pyseccomp

from sandbox.jail import INSN

_CLONE_THREAD = 0x00010000

# Syscalls no harness needs. Each would let a job reach past its own process: other processes
# (ptrace, process_vm_*, pidfd_*), new programs (execve), a kernel surface that bypasses seccomp for
# later I/O (io_uring), namespace and mount changes, or its own limits (setrlimit: with
# isolation="rlimits_only" a job runs as root with capabilities and could lift them).
_DENY_ALWAYS = (
    "fork", "vfork", "execve", "execveat", "ptrace", "process_vm_readv", "process_vm_writev",
    "pidfd_open", "pidfd_send_signal", "pidfd_getfd", "tkill", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "bpf", "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key",
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "kexec_load", "init_module",
    "socket", "socketpair", "setrlimit", "prlimit64",
    "memfd_create", "memfd_secret",  # Anonymous files: memory that RLIMIT_AS does not count.
    # Jobs share a uid: the fork server makes the work root enterable but not listable, so that no job
    # finds another's (randomly named) work dir; chmod would undo that.
    "chmod", "fchmod", "fchmodat", "fchmodat2",
    "finit_module", "delete_module", "reboot", "swapon", "swapoff", "acct", "quotactl",
    # The new mount API: a job drops every capability, but refuse it outright as `mount` is.
    "fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr",
    "open_by_handle_at", "name_to_handle_at",
    # SysV IPC and POSIX message queues live in the fork server's IPC namespace, shared by its jobs,
    # and outlive the job that made them: shared memory detached before exit is memory no job's limit
    # counts, kept until the fork server dies.
    "shmget", "shmat", "shmdt", "shmctl", "msgget", "msgsnd", "msgrcv", "msgctl", "semget", "semop",
    "semtimedop", "semctl", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify",
    "mq_getsetattr",
    # Reach the host's filesystems and caches, not the job's: sync and syncfs (on any file of the
    # read-only binds) write back the host's dirty data; fadvise(DONTNEED) drops the page cache of the
    # files the trusted side runs from.
    "sync", "syncfs", "fadvise64",
    # Per-user kernel objects: jobs share one host uid (sandbox/isolation.py), host root's where they
    # are root underneath, so their watches and instances count against one limit
    # (fs.inotify.max_user_instances is 128) that other jobs, or the trusted side, need too.
    "inotify_init", "inotify_init1", "inotify_add_watch", "fanotify_init", "fanotify_mark",
)  # fmt: skip
_SIGNAL_SYSCALLS = ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")
# Jobs of one fork server share a uid, so these would let one slow down, pin or starve a rival job:
# refused unless the target is the job itself (by its pid; 0, "self", is refused too).
_OWN_PID_ONLY = ("sched_setaffinity", "sched_setscheduler", "sched_setparam", "sched_setattr", "migrate_pages",
                 "move_pages")
# setpriority and ioprio_set take (which, who): a process group or a user would reach rivals too.
_PRIORITY_SYSCALLS = ("setpriority", "ioprio_set")
# fcntl commands that reach past the job. A job that is host root underneath (isolation="rlimits_only"
# as root, or HLJAX_SANDBOX_HOST_UID=caller: sandbox/isolation.py) owns every file of the read-only
# binds (the Python install, this package): a lease (F_SETLEASE) on one of them makes every other
# process's open() of that file, the supervisor's and other jobs' imports included, wait for the
# lease-break time (45 s here) or the job's death. By default jobs run as an unprivileged host uid,
# which the kernel refuses such a lease for ownership (EACCES); the refusal here comes first (EPERM).
# F_SETOWN, F_SETOWN_EX and F_SETSIG make the kernel signal another process when a descriptor is ready,
# and F_NOTIFY signals on directory changes: ways around the kill filter below. F_SETPIPE_SZ grows a
# pipe to 1 MiB of kernel memory that no job limit counts; the write-hint commands set state on the
# host's inodes. Advisory locks (F_SETLK, flock) stay allowed: they hold up only processes that take
# locks too, and nothing trusted locks the files jobs see.
_FCNTL_REFUSED = {
    "F_SETOWN": 8, "F_SETSIG": 10, "F_SETOWN_EX": 15, "F_SETLEASE": 1024, "F_NOTIFY": 1026,
    "F_SETPIPE_SZ": 1031, "F_SET_RW_HINT": 1036, "F_SET_FILE_RW_HINT": 1038,
}  # fmt: skip
# ioctl requests of the same kinds: set the process (group) a descriptor signals, make a terminal the
# controlling one, or push input into a terminal another process reads.
_IOCTL_REFUSED = {"FIOSETOWN": 0x8901, "SIOCSPGRP": 0x8902, "TIOCSPGRP": 0x5410, "TIOCSCTTY": 0x540E, "TIOCSTI": 0x5412}
# fcntl and ioctl take their command as a 32-bit int, and the kernel ignores the upper half of the
# register; seccomp compares all 64 bits. Compare the low half only, or (1 << 32) | F_SETOWN passes.
_LOW_32 = 0xFFFFFFFF

# Stands in for the job's pid, which each child writes into the program. Above any pid (pid_max <= 2^22).
_PID_PLACEHOLDER = 0x3FFFFFF1


def build_filter(pid: int) -> pyseccomp.SyscallFilter:
    """Allow by default; refuse (EPERM) what reaches past the job. `pid` is the job's own pid.

    Refusals return an error instead of killing the process, so the harness sees an ordinary
    OSError and its traceback is reported.
    """
    eperm = pyseccomp.ERRNO(errno.EPERM)
    f = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    for name in _DENY_ALWAYS:
        f.add_rule(eperm, name)
    # Threads yes, processes no: clone without CLONE_THREAD makes a process.
    f.add_rule(eperm, "clone", pyseccomp.Arg(0, pyseccomp.MASKED_EQ, _CLONE_THREAD, 0))
    # clone3 passes its flags in memory that seccomp cannot read; ENOSYS makes glibc fall back to clone.
    f.add_rule(pyseccomp.ERRNO(errno.ENOSYS), "clone3")
    # No sockets of any family: no network, not even loopback, and no unix sockets (the job channel
    # is pipes), which without bubblewrap's namespaces would reach the host's abstract sockets.
    # Signals only to itself: kill(-1, 9) and kill(getppid(), 9) fail with EPERM.
    for name in _SIGNAL_SYSCALLS + _OWN_PID_ONLY:
        f.add_rule(eperm, name, pyseccomp.Arg(0, pyseccomp.NE, pid))
    for name in _PRIORITY_SYSCALLS:
        f.add_rule(eperm, name)
    for cmd in _FCNTL_REFUSED.values():
        f.add_rule(eperm, "fcntl", pyseccomp.Arg(1, pyseccomp.MASKED_EQ, _LOW_32, cmd))
    for request in _IOCTL_REFUSED.values():
        f.add_rule(eperm, "ioctl", pyseccomp.Arg(1, pyseccomp.MASKED_EQ, _LOW_32, request))
    return f


@dataclasses.dataclass(frozen=True)
class Program:
    """The filter as BPF plus the offsets of the pid operands to fill in per child."""

    bpf: bytes
    pid_offsets: tuple[int, ...]


def job_program() -> Program:
    """Generate the job filter once (it is the same for every job but for the pid)."""
    read_fd, write_fd = os.pipe()
    try:
        with os.fdopen(write_fd, "wb") as fh:
            build_filter(_PID_PLACEHOLDER).export_bpf(fh)
        bpf = os.read(read_fd, 1 << 20)
    finally:
        os.close(read_fd)
    offsets = tuple(off for off in range(0, len(bpf), INSN.size) if INSN.unpack_from(bpf, off)[3] == _PID_PLACEHOLDER)
    # libseccomp shares one comparison block among the signal syscalls: expect at least one.
    if not offsets:
        raise RuntimeError("no pid operand found in the generated seccomp program")
    return Program(bpf, offsets)
