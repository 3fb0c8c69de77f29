"""Messages between the supervisor, the fork servers and job processes.

Runs on both sides of the sandbox boundary: standard library only.

Two kinds of channel:
- control (supervisor <-> fork server): an AF_UNIX SOCK_SEQPACKET pair carrying fixed-size packets
  (`Control`). `SPAWN` carries the job's four pipe ends (job in, job out, stdout, stderr) as
  SCM_RIGHTS.
- job (supervisor <-> one job process): two pipes, one each way. A frame is a 4-byte big-endian
  length, then the body.

Encodings follow trust. What the supervisor writes is trusted, so frames to a job are `marshal`,
whose decoder is plain C: JSON's Python-level decoder touches some 70 pages, and in a forked child
each first touch is a copy-on-write fault (see docs/benchmarks.md). What a job writes is untrusted,
so frames from a job are UTF-8 JSON, never marshal or pickle, which can crash or run code in the
reader. Control packets are plain integers both ways, for the same two reasons.

Job channel messages (`t` is the type):
  supervisor -> job:  {"t": "job", "code", "question", "tools": [names]}
                      {"t": "reply", "value"} | {"t": "refused", "kind", "message"}
  job -> supervisor:  {"t": "generate", "prompts": [str], "sampling": {...}}
                      {"t": "tool", "name", "args": [...], "kwargs": {...}}
                      {"t": "result", "answer": str} | {"t": "result", "error": {"type", "message", "traceback"}}
"""

from __future__ import annotations

import dataclasses
import json
import marshal
import os
import re
import socket
import struct

_HEADER = struct.Struct(">I")

# Control packet kinds. Supervisor -> fork server: SPAWN (fds attached), KILL.
# Fork server -> supervisor: READY (job = the server's pid), EXITED (a = wait status,
# b = max RSS in KiB), SPAWN_FAILED (a = errno).
SPAWN, KILL, READY, EXITED, SPAWN_FAILED = b"S", b"K", b"R", b"X", b"F"
_CONTROL = struct.Struct(">cqqq")


class ProtocolError(Exception):
    """A peer sent something that is not a well-formed message."""


# ----- job channel ----------------------------------------------------------------------------


def to_job(msg: dict) -> bytes:
    """A frame from the supervisor to a job."""
    body = marshal.dumps(msg)
    return _HEADER.pack(len(body)) + body


def _not_json(obj):
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


# What json.dumps builds on every call, built once in the fork server: in a forked job each page
# that setup touches is a copy-on-write fault (~40 per job). ASCII escapes let lone surrogates through.
_encode_json = json.encoder.c_make_encoder(
    None, _not_json, json.encoder.encode_basestring_ascii, None, ":", ",", False, False, True
)


def from_job(msg: dict) -> bytes:
    """A frame from a job to the supervisor."""
    body = "".join(_encode_json(msg, 0)).encode("ascii")
    return _HEADER.pack(len(body)) + body


def count_values(body: bytes, limit: int) -> int:
    """How many JSON values `body` holds, as far as `limit` matters: the result is above `limit` exactly
    when the values are (valid JSON, compact as the jobs' encoder writes it; whitespace inside an empty
    container only counts one too many). At C speed, without decoding.

    Every value but the first follows a ',' or a ':', or is the first in a container, outside strings.
    A cheap count over the whole body (strings included) settles almost every frame; only one with
    more punctuation than `limit` (a long text, or an attack) has its strings cut out first: escaped
    backslashes, then escaped quotes, leave every '"' a string's start or end. Past `limit` the count
    stops early, and the result is then just something above it."""
    cheap = body.count(b",") + body.count(b":") + body.count(b"[") + body.count(b"{") + 1
    if cheap <= limit:
        return cheap
    unescaped = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    quotes = unescaped.count(b'"')
    if quotes // 2 > limit:  # Every string is a value: too many before anything else is counted.
        return quotes // 2
    outside = b"".join(unescaped.split(b'"')[::2])
    # An empty container has no first value.
    openers = outside.count(b"[") + outside.count(b"{") - outside.count(b"[]") - outside.count(b"{}")
    return outside.count(b",") + outside.count(b":") + openers + 1


def decode_from_job(body: bytes, max_values: int = 1 << 62) -> dict:
    """The message in a job's frame; ProtocolError unless it is a JSON object with a string `t` and at
    most `max_values` JSON values (bounding what decoding costs the supervisor, see count_values)."""
    values = count_values(body, max_values)
    if values > max_values:
        raise ProtocolError(f"frame holds over {max_values} JSON values ({values} counted)")
    try:
        msg = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:  # RecursionError: absurd nesting.
        raise ProtocolError(f"not UTF-8 JSON: {type(e).__name__}: {e}") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("t"), str):
        raise ProtocolError("a message must be a JSON object with a string field 't'")
    if _SURROGATE_ESCAPE.search(body):
        msg = _replace_lone_surrogates(msg)
    return msg


# JSON may escape a lone UTF-16 surrogate ("\ud800"); Python decodes it into a str that
# .encode("utf-8") later refuses (a harness answer, a prompt for the Generator, an error message).
# Every string of a job's message has them replaced by U+FFFD here, at the boundary. (Escaped
# pairs decode to one astral character and are left alone; raw surrogate bytes are not UTF-8.)
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _replace_lone_surrogates(msg: dict) -> dict:
    def fix(value):
        return _LONE_SURROGATE.sub("\ufffd", value) if isinstance(value, str) else value

    root = {"": msg}
    stack = [root]  # Iterative: json.loads accepted nesting as deep as the recursion limit.
    while stack:
        obj = stack.pop()
        pairs = list(obj.items()) if isinstance(obj, dict) else list(enumerate(obj))
        if isinstance(obj, dict):
            obj.clear()
        for key, value in pairs:
            value = fix(value)
            if isinstance(obj, dict):
                obj[fix(key)] = value
            else:
                obj[key] = value
            if isinstance(value, (dict, list)):
                stack.append(value)
    return root[""]


class FrameReader:
    """Incremental parser, in the supervisor, of the frames a job writes to its non-blocking pipe."""

    def __init__(self, max_frame_bytes: int, max_values: int = 1 << 62):
        self._max = max_frame_bytes
        self._max_values = max_values
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
            out.append(decode_from_job(body, self._max_values))
        return out


def send_from_job(fd: int, msg: dict) -> None:
    """In a job: write one frame to the supervisor (blocking)."""
    data = memoryview(from_job(msg))
    while data:
        n = os.write(fd, data)
        data = data[n:]


def recv_in_job(fd: int) -> dict | None:
    """In a job: read one frame from the supervisor (blocking); None at end of stream."""
    header = _read_exact(fd, _HEADER.size)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    body = _read_exact(fd, size)
    if body is None:
        raise ProtocolError("stream ended inside a frame")
    return marshal.loads(body)


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


# ----- control channel ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Control:
    """One control packet."""

    kind: bytes  # SPAWN, KILL, READY, EXITED or SPAWN_FAILED.
    job: int
    a: int = 0
    b: int = 0


def send_control(sock: socket.socket, packet: Control, fds: tuple[int, ...] = ()) -> None:
    """One control packet, with descriptors attached if any."""
    data = _CONTROL.pack(packet.kind, packet.job, packet.a, packet.b)
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.send(data)


def recv_control(sock: socket.socket, max_fds: int = 0) -> tuple[Control | None, list[int]]:
    """One control packet and its descriptors; (None, []) when the peer has closed the channel."""
    data, fds, _flags, _addr = socket.recv_fds(sock, _CONTROL.size + 1, max_fds)
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    if len(data) != _CONTROL.size:
        for fd in fds:
            os.close(fd)
        raise ProtocolError(f"control packet of {len(data)} bytes, expected {_CONTROL.size}")
    return Control(*_CONTROL.unpack(data)), fds
