"""`ScorerProcess`: the supervisor's handle on the scorer process (sandbox/score_server.py).

Harness answers are untrusted text, and some task scorers evaluate them: reasoning-gym 0.1.25's
n_queens scorer calls `eval` on the answer. Scored in the trainer, such an answer could rewrite the
scorer for every later answer or read references. So the pool scores answers (`IsolatedScorer`)
only in this separate process, started like a fork server (under bubblewrap: no network, no
capabilities, read-only Python, site-packages and scorer packages, a private tmpfs), and there
each answer in a fresh forked, confined child (see score_server.py). The supervisor sends the
scorer spec, the payloads and the answers of one `pool.run` in one round trip and reads back only
JSON numbers and short error strings.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import pickle
import socket
import subprocess
import tempfile
import time
from typing import Any, Sequence

from sandbox import isolation
from sandbox.config import SandboxConfig
from sandbox.results import ScorerSpec
from sandbox.score_server import MAX_ERROR_CHARS, recv_frame, send_frame

log = logging.getLogger(__name__)

_MAX_REPLY_BYTES = 64 << 20


class ScorerUnavailable(RuntimeError):
    """The scorer process could not be started, or a scorer could not be built in it."""


@dataclasses.dataclass(frozen=True)
class Scored:
    """One answer's outcome: `failure` is set when the scorer process itself failed (an
    infrastructure error, not a score); otherwise `value` and `error` (a scorer error, scoring 0)."""

    value: float = 0.0
    error: str = ""
    failure: str = ""


class ScorerProcess:
    """Started on first use; restarted on the next batch after it fails."""

    def __init__(self, config: SandboxConfig):
        self.config = config
        self._proc: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self._log = None
        self._tmp = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        spec = None
        try:
            if self.config.isolation == "bwrap":
                spec = isolation.scorer_bwrap_launch(self.config, theirs.fileno())
            else:
                self._tmp = self._tmp or tempfile.TemporaryDirectory(prefix="hljax-scorer-")
                spec = isolation.scorer_bare_launch(self.config, theirs.fileno(), os.path.join(self._tmp.name, "score"))
            self._log = tempfile.TemporaryFile()
            self._proc = subprocess.Popen(
                spec.argv, env=spec.env, pass_fds=(theirs.fileno(), *spec.fds), stdin=subprocess.DEVNULL,
                stdout=self._log, stderr=self._log, start_new_session=True,
            )  # fmt: skip
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
            for fd in spec.fds if spec is not None else ():
                os.close(fd)
        self._sock = ours
        ours.settimeout(self.config.start_timeout_s)
        try:
            reply = self._recv()
        except (OSError, ValueError) as e:
            reply = {"t": str(e)}
        if reply.get("t") != "ready":
            tail = self._log_tail()
            self.close()
            raise ScorerUnavailable(f"the scorer process did not start: {reply.get('t')}; its log: {tail or 'empty'}")

    def score(self, spec: ScorerSpec, payloads: Sequence[Any], items: Sequence[tuple[int, str]]) -> list[Scored]:
        """Score `items` ((payload index, answer) pairs), one `Scored` each, in order."""
        if not items:
            return []
        if self._proc is None:
            self._start()
        batch = {"specs": [spec], "payloads": list(payloads), "items": [(0, p, a) for p, a in items]}
        rounds = math.ceil(len(items) / self.config.scorer_parallel)
        # Building a scorer (a reasoning-gym dataset) may take a while the first time.
        budget = self.config.start_timeout_s + rounds * (self.config.scorer_timeout_s + 1.0)
        started = time.monotonic()
        try:
            self._sock.settimeout(budget)
            send_frame(self._sock, pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL))
            self._sock.settimeout(max(0.01, budget - (time.monotonic() - started)))
            reply = self._recv()
            if reply.get("t") == "error":
                raise ScorerUnavailable(str(reply.get("message")))
            results = reply.get("results")
            if reply.get("t") != "scores" or not isinstance(results, list) or len(results) != len(items):
                raise ValueError(f"malformed reply of type {reply.get('t')!r}")
            return [_scored(r) for r in results]
        except (OSError, ValueError, TypeError) as e:
            why = f"the scorer process failed ({type(e).__name__}: {e}); its log: {self._log_tail()[-500:] or 'empty'}"
            log.error("%s; it will be restarted", why)
            self.close()
            return [Scored(failure=why)] * len(items)

    def _recv(self) -> dict:
        frame = recv_frame(self._sock, _MAX_REPLY_BYTES)
        if frame is None:
            raise ConnectionError("the scorer process closed its channel")
        reply = json.loads(frame.decode("utf-8"))
        if not isinstance(reply, dict):
            raise ValueError("reply is not an object")
        return reply

    def _log_tail(self, n: int = 2000) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        return self._log.read().decode("utf-8", "replace")[-n:].strip()

    def close(self) -> None:
        """Stop the process (its children die with it). Idempotent; a later `score` starts a new one."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            try:
                self._proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def shutdown(self) -> None:
        self.close()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


def _scored(item) -> Scored:
    """A reply entry [value, error], checked: the process is confined, not trusted."""
    if not (isinstance(item, list) and len(item) == 2 and isinstance(item[1], str)):
        raise ValueError("malformed score entry")
    value = item[0]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"malformed score value {value!r}")
    return Scored(value=float(value), error=item[1][:MAX_ERROR_CHARS])
