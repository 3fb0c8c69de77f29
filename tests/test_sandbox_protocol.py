"""Framing and encodings of the sandbox channels, without processes."""

import os
import socket

import pytest

from sandbox import protocol


def test_frames_split_and_joined_across_reads():
    stream = protocol.from_job({"t": "a", "x": [1, "é"]}) + protocol.from_job({"t": "b"})
    reader = protocol.FrameReader(1000)
    assert reader.feed(stream[:3]) == []
    assert reader.feed(stream[3:10]) == []
    assert reader.feed(stream[10:]) == [{"t": "a", "x": [1, "é"]}, {"t": "b"}]


def test_job_frames_are_ascii_json_and_lone_surrogates_become_replacement_characters():
    # The job can send them (its encoder never fails); the supervisor's reader replaces them.
    frame = protocol.from_job({"t": "result", "answer": "\ud800 ok \U0001F600"})
    assert frame[4:] == b'{"t":"result","answer":"\\ud800 ok \\ud83d\\ude00"}'
    assert protocol.FrameReader(100).feed(frame) == [{"t": "result", "answer": "\ufffd ok \U0001F600"}]
    with pytest.raises(TypeError, match="not JSON serializable"):
        protocol.from_job({"t": "x", "v": object()})


@pytest.mark.parametrize(
    "body, error",
    [
        (b"[1, 2]", "a message must be a JSON object with a string field 't'"),
        (b'{"t": 3}', "a message must be a JSON object with a string field 't'"),
        (b"\xff", "not UTF-8 JSON: UnicodeDecodeError"),
        (b"{", "not UTF-8 JSON: JSONDecodeError"),
    ],
)
def test_bad_frames_are_protocol_errors(body, error):
    with pytest.raises(protocol.ProtocolError, match=error):
        protocol.FrameReader(100).feed(len(body).to_bytes(4, "big") + body)


def _values(obj) -> int:
    if isinstance(obj, dict):
        return 1 + sum(1 + _values(v) for v in obj.values())  # A key is a value too.
    if isinstance(obj, list):
        return 1 + sum(_values(v) for v in obj)
    return 1


@pytest.mark.parametrize(
    "msg",
    [
        {"t": "result", "answer": "a, b: [c] {d}" * 50},  # Punctuation inside a string is no value.
        {"t": "result", "answer": 'quote " and backslash \\ and both \\" then , [ {' * 40},
        {"t": "tool", "name": "f", "args": [[1, 2.5, None, True], {"k": ["v", "w"]}, [], {}] * 20, "kwargs": {}},
        {"t": "x", "s": ["\\", '"', '\\"', ",", "", ":"] * 30},
    ],
)
def test_the_value_bound_is_exact_without_decoding(msg):
    # Below the punctuation count (strings included): the strings are cut out and the values counted.
    body, n = protocol.from_job(msg)[4:], _values(msg)
    assert protocol.count_values(body, n) == n and protocol.count_values(body, n - 1) == n
    assert protocol.decode_from_job(body, n) == msg
    with pytest.raises(protocol.ProtocolError, match=f"frame holds over {n - 1} JSON values"):
        protocol.decode_from_job(body, n - 1)


def test_a_frame_of_many_small_values_is_refused_before_it_is_decoded():
    body = b'{"t": "x", "v": [' + b"[]," * 350_000 + b"[]]}"  # 1 MiB: ~0.1 s and ~25 MB to decode.
    with pytest.raises(protocol.ProtocolError, match="frame holds over 20000 JSON values"):
        protocol.FrameReader(2 << 20, max_values=20_000).feed(len(body).to_bytes(4, "big") + body)


def test_oversized_frame_is_refused_from_its_header():
    with pytest.raises(protocol.ProtocolError, match="frame of 101 bytes exceeds the limit of 100"):
        protocol.FrameReader(100).feed((101).to_bytes(4, "big"))


def test_frames_to_a_job_round_trip():
    r, w = os.pipe()
    msg = {"t": "reply", "value": ["x", 1.5, None, {"k": [True]}]}
    os.write(w, protocol.to_job(msg))
    os.close(w)
    assert protocol.recv_in_job(r) == msg
    assert protocol.recv_in_job(r) is None  # End of stream.
    os.close(r)


def test_control_packets_carry_descriptors():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    r, w = os.pipe()
    protocol.send_control(a, protocol.Control(protocol.SPAWN, 7), (w,))
    packet, fds = protocol.recv_control(b, max_fds=4)
    assert packet == protocol.Control(protocol.SPAWN, 7, 0, 0) and len(fds) == 1
    os.write(fds[0], b"through")
    assert os.read(r, 10) == b"through"
    a.send(b"short")
    with pytest.raises(protocol.ProtocolError, match="control packet of 5 bytes"):
        protocol.recv_control(b)
    a.close()
    assert protocol.recv_control(b) == (None, [])
    for fd in (r, w, *fds):
        os.close(fd)
    b.close()
