"""SIGTERM and SIGINT stop a run at its next safe point (hljax/signals.py, launch/common.py): one
line, exit 143 or 130; a second Ctrl-C quits at once; a wait for a server ends within 2 s."""

import os
import signal
import subprocess
import sys
import time

import pytest

from hljax import signals

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A run with a safe point every 0.1 s, or a wait for a server on a port nobody listens on.
SCRIPT = """
import sys, time
from launch.common import setup_logging, stop_on_signals
from hljax.signals import stop_point
if sys.argv[1] == "wait":
    from hljax.generate.client import SGLangGenerator
setup_logging()
with stop_on_signals("stopping after the current round"):
    print("ready", flush=True)
    if sys.argv[1] == "rounds":
        for t in range(600):
            stop_point(f"{t} round(s) kept")
            time.sleep(0.1)
    elif sys.argv[1] == "busy":  # No safe point for a long while: only a second Ctrl-C ends it early.
        time.sleep(60)
    else:
        SGLangGenerator("http://127.0.0.1:9").wait_until_ready(300, name="solver", report_every_s=0.5)
"""


def _start(mode: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, mode], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _finish(proc, sig, count: int = 1, gap_s: float = 0.3) -> tuple[int, str, float]:
    time.sleep(1.0)
    for _ in range(count):
        proc.send_signal(sig)
        time.sleep(gap_s)
    start = time.monotonic()
    out, _ = proc.communicate(timeout=30)
    return proc.returncode, out, time.monotonic() - start + gap_s


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_at_the_next_safe_point(sig, code):
    rc, out, elapsed = _finish(_start("rounds"), sig)
    assert rc == code, out
    assert "Traceback" not in out
    name = signal.Signals(sig).name
    assert f"{name} received: stopping after the current round" in out
    assert f"== stopped == {name}:" in out and "round(s) kept; rerun the same command to resume" in out
    assert elapsed < 2, elapsed


def test_a_second_ctrl_c_quits_at_once():
    rc, out, elapsed = _finish(_start("busy"), signal.SIGINT, count=2)
    assert rc == 130, out
    assert "== interrupted ==" in out and "Traceback" not in out
    assert elapsed < 5, elapsed


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_wait_for_a_server_is_visible_and_ends_on_a_signal(sig, code):
    rc, out, elapsed = _finish(_start("wait"), sig, gap_s=0.0)
    assert rc == code, out
    assert "waiting for solver at http://127.0.0.1:9: " in out and " s left" in out  # The countdown.
    assert "stopped while waiting for solver at http://127.0.0.1:9" in out
    assert "Traceback" not in out
    assert elapsed < 2, elapsed


def test_stop_point_is_a_no_op_outside_a_run_and_raises_inside():
    signals.stop_point()
    with signals.StopSignals("stopping", announce=False) as stops:
        signals.stop_point()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        assert stops.requested
        with pytest.raises(signals.Stopped) as e:
            signals.stop_point("2 rounds kept")
    assert e.value.exit_code == 143 and str(e.value).startswith("SIGTERM: 2 rounds kept")
    assert signal.getsignal(signal.SIGTERM) is not stops._handle  # Handlers restored.
