"""Messages between the supervisor, the fork server and job processes.

Runs on both sides of the sandbox boundary: standard library only.

Two kinds of channel:
- control (supervisor <-> fork server): an AF_UNIX SOCK_SEQPACKET pair. One JSON object per
  packet; `spawn` carries the job's four pipe ends (job in, job out, stdout, stderr) as SCM_RIGHTS.
- job (supervisor <-> one job process): two pipes, one each way. Frames are a 4-byte big-endian
  length then that many bytes of UTF-8 JSON. JSON, never pickle: what a job sends is untrusted,
  and unpickling it in the supervisor would run its code there.

Job channel messages (`t` is the type):
  supervisor -> job:  {"t": "job", "code", "question", "tools": [names]}
                      {"t": "reply", "value"} | {"t": "refused", "kind", "message"}
  job -> supervisor:  {"t": "generate", "prompts": [str], "sampling": {...}}
                      {"t": "tool", "name", "args": [...], "kwargs": {...}}
                      {"t": "result", "answer": str} | {"t": "result", "error": {"type", "message", "traceback"}}
Control messages:
  supervisor -> server: {"t": "spawn", "job": int} + fds | {"t": "kill", "job": int}
  server -> supervisor: {"t": "ready", "pid"} | {"t": "exited", "job", "status", "maxrss_kb"}
                        | {"t": "spawn_failed", "job", "error"}
"""

from __future__ import annotations

import json
import os
import socket
import struct

_HEADER = struct.Struct(">I")
CONTROL_MAX_BYTES = 1 << 16  # Control packets are small; a bigger one is a bug.


class ProtocolError(Exception):
    """A peer sent something that is not a well-formed message."""


def encode(msg: dict) -> bytes:
    """One job-channel frame."""
    body = json.dumps(msg, ensure_ascii=False).encode("utf-8")
    return _HEADER.pack(len(body)) + body


def decode_body(body: bytes) -> dict:
    """The message in a frame body; ProtocolError unless it is a JSON object with a string `t`."""
    try:
        msg = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:  # RecursionError: absurd nesting.
        raise ProtocolError(f"not UTF-8 JSON: {type(e).__name__}: {e}") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("t"), str):
        raise ProtocolError("a message must be a JSON object with a string field 't'")
    return msg


class FrameReader:
    """Incremental frame parser for bytes arriving on a non-blocking stream."""

    def __init__(self, max_frame_bytes: int):
        self._max = max_frame_bytes
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[dict]:
        """Append `data`; return the messages completed by it. ProtocolError on a bad frame."""
        self._buf += data
        out = []
        while len(self._buf) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self._buf)
            if size > self._max:
                raise ProtocolError(f"frame of {size} bytes exceeds the limit of {self._max}")
            end = _HEADER.size + size
            if len(self._buf) < end:
                break
            body = bytes(self._buf[_HEADER.size : end])
            del self._buf[:end]
            out.append(decode_body(body))
        return out

    @property
    def pending_bytes(self) -> int:
        return len(self._buf)


def send_blocking(fd: int, msg: dict) -> None:
    """Write one frame to a blocking descriptor (the job side)."""
    data = memoryview(encode(msg))
    while data:
        n = os.write(fd, data)
        data = data[n:]


def recv_blocking(fd: int) -> dict | None:
    """Read one frame from a blocking descriptor (the job side); None at end of stream."""
    header = _read_exact(fd, _HEADER.size)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    body = _read_exact(fd, size)
    if body is None:
        raise ProtocolError("stream ended inside a frame")
    return decode_body(body)


def _read_exact(fd: int, n: int) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        chunk = os.read(fd, n - got)
        if not chunk:
            if got:
                raise ProtocolError("stream ended inside a frame")
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def send_control(sock: socket.socket, msg: dict, fds: tuple[int, ...] = ()) -> None:
    """One control packet, with descriptors attached if any."""
    data = json.dumps(msg).encode("utf-8")
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.send(data)


def recv_control(sock: socket.socket, max_fds: int = 0) -> tuple[dict | None, list[int]]:
    """One control packet and its descriptors; (None, []) when the peer has closed the channel."""
    data, fds, _flags, _addr = socket.recv_fds(sock, CONTROL_MAX_BYTES, max_fds)
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    return decode_body(data), fds
