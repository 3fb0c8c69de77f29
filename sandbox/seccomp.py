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
)  # fmt: skip
_SIGNAL_SYSCALLS = ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")
# Jobs of one fork server share a uid, so these would let one slow down, pin or starve a rival job:
# refused unless the target is the job itself (by its pid; 0, "self", is refused too).
_OWN_PID_ONLY = ("sched_setaffinity", "sched_setscheduler", "sched_setparam", "sched_setattr", "migrate_pages",
                 "move_pages")
# setpriority and ioprio_set take (which, who): a process group or a user would reach rivals too.
_PRIORITY_SYSCALLS = ("setpriority", "ioprio_set")
# fcntl commands that make the kernel signal another process (SIGIO/SIGURG, or any signal with F_SETSIG)
# when the descriptor is ready: a way around the kill filter below.
_FCNTL_SIGNAL_OWNER = (8, 10, 15)  # F_SETOWN, F_SETSIG, F_SETOWN_EX

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
    for cmd in _FCNTL_SIGNAL_OWNER:
        f.add_rule(eperm, "fcntl", pyseccomp.Arg(1, pyseccomp.EQ, cmd))
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
