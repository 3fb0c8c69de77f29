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
