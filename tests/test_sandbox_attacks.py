"""Attacks on the machine and on the job's own limits (CPU, memory, processes, files, signals, network,
privileges), each run in a pool that is running normal jobs at the same time.

Every test checks that the normal jobs came back correct, that no fork server died or was
replaced, and that the pool still serves afterwards (`run_among_normals`). Signal and fork attacks
run only where `require_contained` holds (tests/_sandbox_attack_kit.py).
"""

import ast
import json
import os
import socket

import pytest

from sandbox import isolation
from tests._sandbox_attack_kit import (  # noqa: F401 - `pool` is a fixture.
    KILL_BODY, OWN_PIDNS, SECRET, TAIL, guarded, needs_bwrap, pool, probe, require_contained, run_among_normals,
)

pytestmark = needs_bwrap


def test_jobs_are_contained(pool):
    info = probe(pool)
    assert info["pidns"] != OWN_PIDNS
    assert int(info["capeff"], 16) == 0
    assert info["seccomp"] == "2"


def test_infinite_loop(pool):
    r = run_among_normals(pool, "def solve(q, s):\n    while True:\n        pass\n")
    assert r.status == "timeout" and r.run_s >= 2.0


def test_loop_that_catches_base_exception(pool):
    code = (
        "def solve(q, s):\n"
        "    while True:\n"
        "        try:\n"
        "            while True:\n"
        "                pass\n"
        "        except BaseException:\n"
        "            pass\n"
    )
    assert run_among_normals(pool, code).status == "timeout"


def test_sleep_forever(pool):
    r = run_among_normals(pool, "import time\ndef solve(q, s):\n    time.sleep(10**6)\n")
    assert r.status == "timeout" and "deadline" in r.reason


def test_memory_bomb(pool):
    code = (
        "import resource\n"
        "def solve(q, s):\n"
        "    try:\n"
        "        resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY,) * 2)\n"
        "    except (OSError, ValueError):\n"
        "        pass\n"
        "    hog = []\n"
        "    while True:\n"
        "        hog.append(bytearray(32 << 20))\n"
    )
    r = run_among_normals(pool, code)
    assert r.status == "error" and r.error.type == "MemoryError"


def test_fork_bomb(pool):
    require_contained(pool)
    code = guarded("    while True:\n        os.fork()\n")
    r = run_among_normals(pool, code, question=OWN_PIDNS)
    assert r.status == "error" and r.error.type == "PermissionError"


def test_subprocess_and_multiprocessing_fail(pool):
    require_contained(pool)
    body = (
        "    import subprocess, multiprocessing\n"
        "    out = []\n"
        "    starts = (lambda: subprocess.run(['/bin/true']), lambda: multiprocessing.Process(target=print).start())\n"
        "    for start in starts:\n"
        "        try:\n"
        "            start()\n"
        "            out.append('started')\n"
        "        except OSError as e:\n"
        "            out.append(type(e).__name__)\n"
        "    return ' '.join(out)\n"
    )
    r = run_among_normals(pool, guarded(body), question=OWN_PIDNS)
    assert r.answer == "PermissionError PermissionError"


def test_thread_spray(pool):
    code = (
        "import threading, time\n"
        "def solve(q, s):\n"
        "    n = 0\n"
        "    try:\n"
        "        while True:\n"
        "            threading.Thread(target=time.sleep, args=(1000,), daemon=True).start()\n"
        "            n += 1\n"
        "    except RuntimeError:\n"
        "        return str(n)\n"
    )
    r = run_among_normals(pool, code)
    # 8 MiB stacks under a 256 MiB address space: a few dozen threads at most.
    assert r.status == "ok" and 0 < int(r.answer) < 64


def test_200_mb_of_stdout(pool):
    code = (
        "import sys\n"
        "def solve(q, s):\n"
        "    chunk = 'x' * (1 << 20)\n"
        "    for _ in range(200):\n"
        "        sys.stdout.write(chunk)\n"
        "    return 'done'\n"
    )
    r = run_among_normals(pool, code)
    assert r.status == "ok" and r.answer == "done"
    assert r.stdout_bytes == 200 << 20 and r.stdout_tail == "x" * TAIL


def test_sys_exit(pool):
    r = run_among_normals(pool, "import sys\ndef solve(q, s):\n    sys.exit(0)\n")
    assert r.status == "error" and r.error.type == "SystemExit"


def test_os_exit(pool):
    r = run_among_normals(pool, "import os\ndef solve(q, s):\n    os._exit(0)\n")
    assert r.status == "crashed" and r.reason == "exited with status 0 without sending a result"


def test_kill_parent(pool):
    require_contained(pool)
    body = KILL_BODY.format(target="os.getppid()")
    assert run_among_normals(pool, guarded(body), question=OWN_PIDNS).answer == "refused errno 1"


def test_kill_everything(pool):
    require_contained(pool)
    body = KILL_BODY.format(target="-1")
    assert run_among_normals(pool, guarded(body), question=OWN_PIDNS).answer == "refused errno 1"


def test_socket_to_loopback_and_outside(pool):
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    port = listener.getsockname()[1]
    code = (
        "import socket\n"
        "def attempt(family, kind, addr):\n"
        "    try:\n"
        "        s = socket.socket(family, kind)\n"
        "    except OSError as e:\n"
        "        return f'socket errno {e.errno}'\n"
        "    s.settimeout(1)\n"
        "    try:\n"
        "        s.connect(addr)\n"
        "        return 'connected'\n"
        "    except OSError as e:\n"
        "        return f'connect errno {e.errno}'\n"
        "def solve(q, s):\n"
        f"    tries = [(socket.AF_INET, socket.SOCK_STREAM, ('127.0.0.1', {port})),\n"
        "             (socket.AF_INET, socket.SOCK_STREAM, ('192.0.2.1', 80)),\n"
        "             (socket.AF_INET, socket.SOCK_DGRAM, ('192.0.2.1', 53)),\n"
        "             (socket.AF_INET6, socket.SOCK_STREAM, ('::1', 80)),\n"
        "             (socket.AF_NETLINK, socket.SOCK_RAW, (0, 0)),\n"
        "             (socket.AF_UNIX, socket.SOCK_STREAM, '\\0abstract')]\n"
        "    return ','.join(attempt(*t) for t in tries)\n"
    )
    r = run_among_normals(pool, code)
    assert r.answer == ",".join(["socket errno 1"] * 6)
    with pytest.raises(BlockingIOError):
        listener.accept()  # Nothing ever reached the host's loopback.
    listener.close()


def test_writing_outside_the_work_dir(pool, tmp_path):
    host_file = tmp_path / "pwned"  # A host path: absent from the sandbox, so unreachable.
    targets = ["/etc/pwned", "/usr/pwned", "/pwned", "/opt/hljax/sandbox/worker.py", "/root/pwned", str(host_file)]
    code = (
        "def solve(q, s):\n"
        "    out = []\n"
        f"    for path in {targets!r}:\n"
        "        try:\n"
        "            open(path, 'a').write('x')\n"
        "            out.append('wrote')\n"
        "        except OSError as e:\n"
        "            out.append(type(e).__name__)\n"
        "    open('mine.txt', 'w').write('ok')\n"
        "    try:\n"
        "        open('big.bin', 'wb').write(b'0' * (32 << 20))\n"
        "    except OSError as e:\n"
        "        out.append(e.strerror)\n"
        "    return ','.join(out)\n"
    )
    r = run_among_normals(pool, code)
    # /etc does not exist in the sandbox; /usr, / and the package are read-only; /root is absent. The
    # package's files are refused for ownership first (PermissionError) unless the job's host uid owns
    # them (a non-root caller's own checkout, or HLJAX_SANDBOX_HOST_UID=caller): then the read-only mount.
    package_file = os.path.join(os.path.dirname(isolation.__file__), "worker.py")
    owned = os.stat(package_file).st_uid == isolation.job_host_uid(pool.config)
    expected = ["FileNotFoundError", "OSError", "OSError", "OSError" if owned else "PermissionError", "OSError",
                "FileNotFoundError", "File too large"]  # fmt: skip
    assert r.answer == ",".join(expected)
    assert not host_file.exists()


def test_reading_secrets(pool):
    code = (
        "import os\n"
        "def solve(q, s):\n"
        "    found = [repr(dict(os.environ))]\n"
        "    paths = ['/etc/shadow', '/etc/passwd', '/root/.bash_history', '/proc/1/environ', '/proc/self/environ']\n"
        "    for path in paths:\n"
        "        try:\n"
        "            found.append(path + '=' + open(path, 'rb').read().decode('latin-1'))\n"
        "        except OSError as e:\n"
        "            found.append(path + ':' + type(e).__name__)\n"
        "    return '\\n'.join(found)\n"
    )
    r = run_among_normals(pool, code)
    assert SECRET not in r.answer
    lines = r.answer.split("\n")
    assert lines[1:4] == [f"{p}:FileNotFoundError" for p in ("/etc/shadow", "/etc/passwd", "/root/.bash_history")]
    # literal_eval, not eval: the answer is the harness's text.
    assert ast.literal_eval(lines[0]) == {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp",
                                          "PYTHONHASHSEED": "0", "PWD": "/tmp"}



def test_ctypes_syscalls(pool):
    require_contained(pool)
    body = (
        "    import ctypes\n"
        "    libc = ctypes.CDLL(None, use_errno=True)\n"
        "    out = []\n"
        "    calls = [('kill', lambda: libc.kill(-1, 9)), ('fork', lambda: libc.syscall(57)),\n"
        "             ('clone', lambda: libc.syscall(56, 17, 0, 0, 0, 0)),\n"
        "             ('ptrace', lambda: libc.ptrace(16, 1, 0, 0))]\n"
        "    for name, call in calls:\n"
        "        rc = call()\n"
        "        out.append(f'{name}={rc}/{ctypes.get_errno()}')\n"
        "    return ' '.join(out)\n"
    )
    r = run_among_normals(pool, guarded(body), question=OWN_PIDNS)
    assert r.answer == "kill=-1/1 fork=-1/1 clone=-1/1 ptrace=-1/1"


def test_ctypes_segfault(pool):
    r = run_among_normals(pool, "import ctypes\ndef solve(q, s):\n    return ctypes.string_at(0)\n")
    assert r.status == "crashed" and r.reason == "killed by signal SIGSEGV"



# ----- privileges and kernel knobs (issue 19, items 2, 3, 8) --------------------------------------------


def test_jobs_are_not_root_and_proc_sys_is_read_only(pool):
    # Opens for writing only, never writes: on an unconfined machine these knobs are the host's.
    knobs = ["/proc/sys/kernel/core_pattern", "/proc/sys/vm/overcommit_memory", "/proc/sys/vm/drop_caches"]
    code = (
        "import errno, json, os\n"
        "def solve(q, s):\n"
        "    opened = []\n"
        f"    for path in {knobs!r}:\n"
        "        try:\n"
        "            os.close(os.open(path, os.O_WRONLY))\n"
        "            opened.append('opened')\n"
        "        except OSError as e:\n"
        "            opened.append(errno.errorcode[e.errno])\n"
        "    return json.dumps({'uid': os.getuid(), 'gid': os.getgid(), 'opened': opened})\n"
    )
    r = run_among_normals(pool, code)
    info = json.loads(r.answer)
    assert (info["uid"], info["gid"]) == (65534, 65534), info
    # Refused for ownership (a root-owned 0644 file) unless the job is host root underneath
    # (HLJAX_SANDBOX_HOST_UID=caller as root): then by the read-only bind alone.
    refusal = "EROFS" if isolation.job_host_uid(pool.config) == 0 else "EACCES"
    assert info["opened"] == [refusal] * 3, info


def test_no_memory_outside_the_job_limit_through_dev_or_memfd(pool):
    # 20 files of 15 MiB (RLIMIT_FSIZE caps each file, not their number): 300 MiB, past the job's
    # 256 MiB address space, held in /dev/shm, in /dev itself, or in memfds.
    code = (
        "import errno, os\n"
        "def hold(create):\n"
        "    chunk, fds = b'x' * (15 << 20), []\n"
        "    try:\n"
        "        for i in range(20):\n"
        "            fds.append(create(i))\n"
        "            os.write(fds[-1], chunk)\n"
        "        return f'held {15 * len(fds)} MiB'\n"
        "    except OSError as e:\n"
        "        return f'{errno.errorcode[e.errno]} after {15 * max(0, len(fds) - 1)} MiB'\n"
        "    finally:\n"
        "        for fd in fds:\n"
        "            os.close(fd)\n"
        "def solve(q, s):\n"
        "    flags = os.O_WRONLY | os.O_CREAT\n"
        "    return ','.join([hold(lambda i: os.open(f'/dev/shm/hog{i}', flags, 0o600)),\n"
        "                     hold(lambda i: os.open(f'/dev/hog{i}', flags, 0o600)),\n"
        "                     hold(lambda i: os.memfd_create(f'hog{i}'))])\n"
    )
    r = run_among_normals(pool, code)
    assert r.answer == "EROFS after 0 MiB,EROFS after 0 MiB,EPERM after 0 MiB", r
