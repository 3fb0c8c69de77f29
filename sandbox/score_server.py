"""The scorer process: a long-lived server inside the sandbox that scores harness answers, each in a
fresh forked child.

It holds the task scorers (built from `ScorerSpec`s, e.g. a reasoning-gym dataset) and, during a
batch, that batch's payloads (references). It never holds a harness's process: harnesses run in
the fork servers (worker.py), in other sandboxes. Each answer is scored in its own child, forked
from this server and confined like a job (jail.py: rlimits, the seccomp filter, its own work dir):
a scorer that evaluates its answer (reasoning-gym's n_queens) runs that code in the child, where
anything it changes (the scorer class, the payload) dies with the child. A child that runs past
`timeout_s` is killed; one that dies without a result is reported; both score 0.

Started as `python -I -S -B -c "...; from sandbox.score_server import main; main()" CONFIG_JSON`
(isolation.py). Channel: one SOCK_STREAM socket to the supervisor, frames of a 4-byte big-endian
length and a body. Supervisor -> server: pickle (the trusted side writes it), one batch
{"specs": [ScorerSpec], "payloads": [any], "items": [(spec index, payload index, answer)]}.
Server -> supervisor: UTF-8 JSON, {"t": "ready"} once, then per batch {"t": "scores", "results":
[[value, error]]} in item order, or {"t": "error", "message"} if a scorer could not be built.
Children report to this server in JSON too: their result is untrusted.
"""

from __future__ import annotations

import gc
import importlib
import json
import math
import os
import pickle
import select
import signal
import socket
import struct
import sys
import time
import traceback

from sandbox import jail

_HEADER = struct.Struct(">I")
MAX_ERROR_CHARS = 500  # Of a scorer's error message, what is reported.
_MAX_CHILD_REPORT = 4096


def send_frame(sock: socket.socket, body: bytes) -> None:
    sock.sendall(_HEADER.pack(len(body)) + body)


def recv_frame(sock: socket.socket, limit: int) -> bytes | None:
    """One frame, or None at a clean end of stream. ValueError for a frame over `limit` bytes."""
    header = _recv_exact(sock, _HEADER.size)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    if size > limit:
        raise ValueError(f"frame of {size} bytes is over the {limit}-byte limit")
    body = _recv_exact(sock, size)
    if body is None:
        raise ConnectionError("stream ended inside a frame")
    return body


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            if got:
                raise ConnectionError("stream ended inside a frame")
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _vm_size() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


class ScoreServer:
    def __init__(self, config: dict):
        self.config = config
        self.sock = socket.socket(fileno=config["control_fd"])
        self.scorers: dict = {}  # ScorerSpec -> fn(answer, payload)
        self.devnull = os.open(os.devnull, os.O_RDWR)
        self.jail: jail.Jail | None = None
        self.next_child = 0

    def serve(self) -> None:
        self._jail().harden_server()
        os.makedirs(self.config["tmp_root"], exist_ok=True)
        send_frame(self.sock, json.dumps({"t": "ready"}).encode())
        try:
            while True:
                frame = recv_frame(self.sock, 1 << 34)
                if frame is None:
                    return
                send_frame(self.sock, json.dumps(self._batch(pickle.loads(frame))).encode())
        except (BrokenPipeError, ConnectionResetError):
            pass  # The supervisor went away.

    def _jail(self) -> jail.Jail:
        """A jail whose address-space limit allows the server's current size plus the configured margin."""
        seccomp = self.config["seccomp"]
        limits = jail.JobLimits(
            address_space_bytes=_vm_size() + self.config["extra_memory_bytes"],
            cpu_seconds=self.config["cpu_seconds"],
            file_size_bytes=self.config["file_size_bytes"],
            open_files=self.config["open_files"],
        )
        self.jail = jail.Jail(limits, bytes.fromhex(seccomp["bpf"]), seccomp["pid_offsets"])
        return self.jail

    def _batch(self, batch: dict) -> dict:
        fns = []
        built = False
        for spec in batch["specs"]:
            if spec not in self.scorers:
                module, _, name = spec.factory.partition(":")
                try:
                    self.scorers[spec] = getattr(importlib.import_module(module), name)(**dict(spec.kwargs))
                except Exception:  # noqa: BLE001 - a configuration error, reported to the supervisor.
                    return {"t": "error", "message": f"building scorer {spec}: {traceback.format_exc()[-2000:]}"}
                built = True
            fns.append(self.scorers[spec])
        if built:
            gc.collect()
            gc.freeze()  # Keeps the collector from touching (and so copying) the scorers' pages in children.
            self._jail()  # The server grew: children may grow as much again.
        return {"t": "scores", "results": self._score_all(fns, batch["payloads"], batch["items"])}

    def _score_all(self, fns: list, payloads: list, items: list) -> list:
        results: list = [None] * len(items)
        todo = list(range(len(items)))[::-1]
        running: dict[int, tuple] = {}  # pidfd -> (item index, pid, result read end, deadline, work dir)
        epoll = select.epoll()
        timed_out: set[int] = set()
        try:
            while todo or running:
                while todo and len(running) < self.config["parallel"]:
                    i = todo.pop()
                    spec_i, payload_i, answer = items[i]
                    entry = self._spawn(i, fns[spec_i], answer, payloads[payload_i])
                    if isinstance(entry, str):
                        results[i] = [0.0, entry]
                        continue
                    running[entry[0]] = entry[1:]
                    epoll.register(entry[0], select.EPOLLIN)
                now = time.monotonic()
                wait = min(deadline for _, _, _, deadline, _ in running.values()) - now if running else 0
                for pidfd, _ in epoll.poll(max(0.0, wait)):
                    i, pid, read_fd, _, work_dir = running.pop(pidfd)
                    epoll.unregister(pidfd)
                    os.close(pidfd)
                    _, status = os.waitpid(pid, 0)
                    report = _read_all(read_fd)
                    os.close(read_fd)
                    jail.remove_tree(work_dir)
                    results[i] = self._result(report, status, i in timed_out)
                now = time.monotonic()
                for pidfd, (i, _, _, deadline, _) in running.items():
                    if now >= deadline and i not in timed_out:
                        timed_out.add(i)
                        _kill(pidfd)
        finally:
            for pidfd, (_, pid, read_fd, _, _) in running.items():
                _kill(pidfd)
                os.waitpid(pid, 0)
                os.close(pidfd)
                os.close(read_fd)
            epoll.close()
        return results

    def _spawn(self, index: int, fn, answer: str, payload):
        """Fork one child for one answer: (pidfd, index, pid, read end, deadline, work dir), or why not."""
        read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
        work_dir = f"{self.config['tmp_root']}/{self.next_child}"
        self.next_child += 1
        try:
            pid = os.fork()
        except OSError as e:
            os.close(read_fd)
            os.close(write_fd)
            return f"could not fork a scorer process: {e}"
        if pid == 0:
            self._child(fn, answer, payload, write_fd, work_dir)
        os.close(write_fd)
        os.set_blocking(read_fd, False)
        deadline = time.monotonic() + self.config["timeout_s"]
        return (os.pidfd_open(pid), index, pid, read_fd, deadline, work_dir)

    def _child(self, fn, answer: str, payload, write_fd: int, work_dir: str) -> None:
        """In the forked child: confine, score, report, never return."""
        try:
            self.jail.confine([self.devnull, write_fd, self.devnull, self.devnull], work_dir)
            try:
                out = fn(answer, payload)
                report = {"value": float(getattr(out, "value", out)), "error": str(getattr(out, "error", ""))}
            except BaseException as e:  # noqa: BLE001 - untrusted answers make scorers raise anything.
                report = {"value": 0.0, "error": f"{type(e).__name__}: {e}"}
            report["error"] = report["error"][:MAX_ERROR_CHARS]
            os.write(jail.JOB_OUT_FD, json.dumps(report).encode())
        except BaseException:  # noqa: BLE001 - no report: the server says the child died without one.
            os._exit(4)
        os._exit(0)

    def _result(self, report: bytes, status: int, timed_out: bool) -> list:
        if timed_out:
            return [0.0, f"the scorer ran past {self.config['timeout_s']} s on this answer and was killed"]
        if os.WIFSIGNALED(status):
            return [0.0, f"the scorer process died of signal {os.WTERMSIG(status)} on this answer"]
        try:
            msg = json.loads(report.decode("utf-8"))
            value, error = float(msg["value"]), msg["error"]
            if not isinstance(error, str):
                raise TypeError("error is not a string")
        except Exception:  # noqa: BLE001 - a child that exits without a well-formed report.
            return [0.0, f"the scorer process exited ({os.waitstatus_to_exitcode(status)}) without a result"]
        if not math.isfinite(value):
            return [0.0, f"score {value} is not finite"]
        return [value, error[:MAX_ERROR_CHARS]]


def _read_all(fd: int) -> bytes:
    chunks, total = [], 0
    while total <= _MAX_CHILD_REPORT:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)[: _MAX_CHILD_REPORT + 1]


def _kill(pidfd: int) -> None:
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except ProcessLookupError:
        pass


def main() -> None:
    config = json.loads(sys.argv[1])
    if config.get("become"):  # Started as root of its user namespace (host root): first, drop that.
        become = config["become"]
        jail.become(become["uid"], become["gid"], tuple(become["keep"]))
    ScoreServer(config).serve()
