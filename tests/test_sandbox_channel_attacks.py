"""Attacks on the job channel and the supervisor: garbage, oversized and nested frames, message floods,
unread replies, a clock paused by solver calls. Each runs beside normal jobs.
"""

import dataclasses
import os
import time

from sandbox.pool import SandboxPool
from tests._sandbox_fakes import EchoGenerator
from tests._sandbox_attack_kit import (  # noqa: F401 - `pool` is a fixture.
    CONFIG, needs_bwrap, pool, run_among_normals,
)

pytestmark = needs_bwrap


def test_closing_the_result_pipe(pool):
    r = run_among_normals(pool, "import os\ndef solve(q, s):\n    os.close(4)\n    return 'x'\n")
    assert r.status == "crashed" and r.reason == "exited with status 0 without sending a result"


def test_garbage_on_the_job_channel(pool):
    code = "import os\ndef solve(q, s):\n    os.write(4, b'\\x00\\x00\\x00\\x05notjs')\n    return 'x'\n"
    r = run_among_normals(pool, code)
    assert r.status == "crashed" and r.reason.startswith("protocol violation: not UTF-8 JSON")


def test_oversized_frame_on_the_job_channel(pool):
    code = (
        "import os, time\n"
        "def solve(q, s):\n"
        "    os.write(4, b'\\xff\\xff\\xff\\xff')  # A 4 GiB frame header.\n"
        "    time.sleep(1)\n"
        "    return 'x'\n"
    )
    r = run_among_normals(pool, code)
    assert r.status == "crashed" and "exceeds the limit" in r.reason


def test_deeply_nested_json_on_the_job_channel(pool):
    code = (
        "import os\n"
        "def solve(q, s):\n"
        "    body = b'[' * 200000 + b']' * 200000\n"
        "    os.write(4, len(body).to_bytes(4, 'big') + body)\n"
        "    return 'x'\n"
    )
    r = run_among_normals(pool, code)
    # Refused before decoding: 200,001 values are past max_message_values (the decoder's own recursion
    # limit stops deeper nesting of fewer values: tests/test_sandbox_protocol.py).
    assert r.status == "crashed" and r.reason.startswith("protocol violation: frame holds over 20000 JSON values")



# ----- floods on the job channel (issue 19, items 4 and 5) ----------------------------------------------


class PeakRss:
    """Samples this process's resident size in a thread; `growth` is the peak over the start, in bytes."""

    def __init__(self):
        import threading

        self._stop = threading.Event()
        self.start = self.peak = self._rss()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    @staticmethod
    def _rss() -> int:
        return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _sample(self):
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self._rss())

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    @property
    def growth(self) -> int:
        return self.peak - self.start


def test_message_flood_does_not_stall_the_supervisor_or_its_deadlines(pool):
    # Tool calls written as fast as the pipe takes them for 4 s (twice the deadline); a thread
    # drains the replies so that only the flood itself is measured.
    code = (
        "import json, os, threading, time\n"
        "def drain():\n"
        "    while os.read(3, 1 << 16):\n"
        "        pass\n"
        "def solve(q, s):\n"
        "    threading.Thread(target=drain, daemon=True).start()\n"
        "    body = json.dumps({'t': 'tool', 'name': 'nope', 'args': [], 'kwargs': {}}).encode()\n"
        "    frames = (len(body).to_bytes(4, 'big') + body) * 2000\n"
        "    end = time.monotonic() + 4\n"
        "    while time.monotonic() < end:\n"
        "        os.write(4, frames)\n"
        "    return 'done'\n"
    )
    started = time.monotonic()
    r = run_among_normals(pool, code)
    elapsed = time.monotonic() - started
    assert r.status == "timeout", r
    assert r.run_s < CONFIG.timeout_s + 0.5, r.run_s
    assert elapsed < CONFIG.timeout_s + 2.5, elapsed  # The after-run included; the flood lasted 4 s.


def test_refusals_do_not_echo_requests_that_are_never_read(pool):
    # 1 MiB tool names and sampling keys, replies never read: refusals must not echo them.
    code = (
        "import json, os, time\n"
        "def frame(msg):\n"
        "    body = json.dumps(msg).encode()\n"
        "    return len(body).to_bytes(4, 'big') + body\n"
        "def solve(q, s):\n"
        "    big = 'x' * (1 << 20)\n"
        "    frames = (frame({'t': 'tool', 'name': big, 'args': [], 'kwargs': {}})\n"
        "              + frame({'t': 'generate', 'prompts': ['p'], 'sampling': {big: 1}}))\n"
        "    end = time.monotonic() + 4\n"
        "    while time.monotonic() < end:\n"
        "        os.write(4, frames)\n"
        "    return 'done'\n"
    )
    with PeakRss() as rss:
        r = run_among_normals(pool, code)
    assert r.status in ("timeout", "crashed"), r
    assert rss.growth < 3 * CONFIG.max_message_bytes + (32 << 20), rss.growth


def test_replies_left_unread_past_the_bound_are_a_violation(pool):
    # A tool with 1 MiB results, called without reading them: the supervisor holds at most
    # 2 x max_message_bytes of replies for the job, then ends it.
    code = (
        "import json, os, time\n"
        "def solve(q, s):\n"
        "    body = json.dumps({'t': 'tool', 'name': 'big', 'args': [], 'kwargs': {}}).encode()\n"
        "    for _ in range(64):\n"
        "        os.write(4, len(body).to_bytes(4, 'big') + body)\n"
        "    time.sleep(10)\n"
    )
    with PeakRss() as rss:
        r = run_among_normals(pool, code, tools={"big": lambda: "x" * (1 << 20)})
    assert r.status == "crashed" and "does not read its replies" in r.reason, r
    assert r.run_s < 1.5, r.run_s
    assert rss.growth < 3 * CONFIG.max_message_bytes + (32 << 20), rss.growth


def test_cpu_burnt_while_solver_calls_pause_the_clock_is_bounded_by_the_wall_budget():
    # The deadline clock pauses while a solver call is pending; a thread spinning meanwhile is held
    # by the wall budget (brokered time included), not only by the CPU limit.
    config = dataclasses.replace(CONFIG, wall_timeout_s=3.0)
    code = (
        "import threading\n"
        "def spin():\n"
        "    while True:\n"
        "        pass\n"
        "def solve(q, s):\n"
        "    threading.Thread(target=spin, daemon=True).start()\n"
        "    for i in range(16):\n"
        "        s.generate(f'call {i}')\n"
        "    return 'done'\n"
    )
    with SandboxPool(config, EchoGenerator(delay_s=0.6)) as p:
        r = run_among_normals(p, code)
    assert r.status == "timeout" and "wall budget" in r.reason, r
    assert r.run_s < config.timeout_s, r.run_s  # Its own clock alone would not have stopped it.


def test_closing_the_reply_pipe_while_a_reply_waits_leaves_no_stale_watch(pool):
    # A reply larger than the pipe waits half-written; the job then closes its end. The supervisor
    # must stop watching that descriptor before the number can go to another job's pipes (CI once
    # failed with "FD 29 is already registered" when it was closed behind the selector's back).
    code = (
        "import json, os, time\n"
        "def solve(q, s):\n"
        "    body = json.dumps({'t': 'tool', 'name': 'big', 'args': [], 'kwargs': {}}).encode()\n"
        "    os.write(4, len(body).to_bytes(4, 'big') + body)\n"
        "    time.sleep(0.4)\n"
        "    os.close(3)\n"
        "    time.sleep(0.4)\n"
        "    return 'closed'\n"
    )
    r = run_among_normals(pool, code, tools={"big": lambda: "x" * (512 << 10)})
    assert r.status == "ok" and r.answer == "closed", r
    left = {key.fd for key in pool._selector.get_map().values() if key.data[0] not in ("wake", "control")}
    assert not left, f"descriptors of finished jobs still watched: {left}"
