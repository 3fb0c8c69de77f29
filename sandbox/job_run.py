"""The supervisor's record of one running job: channel buffers, clock, counts, and its final result."""

from __future__ import annotations

import collections
import math
import os
import signal
import time
from typing import Sequence

from hljax.generate.types import Completion
from sandbox import protocol
from sandbox.broker import Budget
from sandbox.config import SandboxConfig
from sandbox.results import HarnessError, Job, JobResult

_MAX_ERROR_MESSAGE = 2000
_MAX_TRACEBACK = 8000
_READ_CHUNK = 1 << 16


def describe_exit(status: int | None) -> str:
    """Why a job process that sent no result ended, from its wait status."""
    if status is None:
        return "no exit status"
    code = os.waitstatus_to_exitcode(status)
    if code >= 0:
        return f"exited with status {code} without sending a result"
    sig = signal.Signals(-code)
    if sig == signal.SIGKILL:
        return "killed by SIGKILL (CPU-time limit or out of memory)"
    if sig == signal.SIGXCPU:
        return "killed by SIGXCPU (CPU-time limit)"
    return f"killed by signal {sig.name}"


class JobRun:
    """Mutable state of one job between spawn and exit; `finish()` freezes it into a JobResult.

    `fds` are the supervisor's ends of the job's four pipes, non-blocking: "to" (requests' replies,
    written here), "from" (the job's messages), "out" and "err" (its stdout and stderr). -1 once closed.
    """

    def __init__(self, key: int, index: int, job: Job, worker, fds: dict[str, int], budget: Budget,
                 config: SandboxConfig):  # fmt: skip
        self.key, self.index, self.job, self.worker = key, index, job, worker
        self.fds = fds
        self.budget = budget
        self.config = config
        self.reader = protocol.FrameReader(config.max_message_bytes, config.max_message_values)
        self.inbox: collections.deque[dict] = collections.deque()  # Read, not yet handled.
        self.outbuf = bytearray()
        self.channel_eof = False  # The job closed (or lost) its end of the channel.
        self.reader_gone = False  # Writing replies failed: the job closed its end of them.
        self.tails = {"out": bytearray(), "err": bytearray()}
        self.nbytes = {"out": 0, "err": 0}
        self.run_s = 0.0
        self.decode_s = 0.0  # Supervisor time spent decoding its messages, charged to its own clock.
        self.started = time.monotonic()  # For the wall budget, which counts brokered calls too.
        self.running_since: float | None = time.monotonic()  # None while a brokered call is pending.
        self.waiting = False
        self.solver_calls = self.prompt_tokens = self.completion_tokens = self.tool_calls = 0
        self.refused_calls = 0  # Prompts of refused solver calls, charged to the call budget.
        self.result: dict | None = None
        self.violation = ""
        self.timed_out = False
        self.timeout_reason = ""
        self.infra = ""
        self.kill_sent_at: float | None = None
        self.has_exited = False
        self.exit_status: int | None = None
        self.maxrss_kb = 0

    # ----- channel ---------------------------------------------------------------------------

    def close(self, kind: str) -> None:
        if self.fds[kind] >= 0:
            os.close(self.fds[kind])
            self.fds[kind] = -1

    @property
    def wants_write(self) -> bool:
        return bool(self.outbuf) and self.fds["to"] >= 0 and not self.reader_gone

    def send(self, msg: dict) -> None:
        """Queue a reply. Replies the job leaves unread beyond 2 x max_message_bytes are a violation:
        an honest job reads each reply before its next request, so only one is ever waiting."""
        frame = protocol.to_job(msg)
        if self.outbuf and len(self.outbuf) + len(frame) > 2 * self.config.max_message_bytes:
            self.violate(f"does not read its replies ({len(self.outbuf)} bytes of them waiting)")
            self.outbuf.clear()
            return
        self.outbuf += frame
        self.flush()

    def flush(self) -> None:
        if self.fds["to"] < 0 or self.reader_gone:
            self.outbuf.clear()
            return
        try:
            n = os.write(self.fds["to"], self.outbuf)
            del self.outbuf[:n]
        except BlockingIOError:
            pass
        except OSError:  # The job closed its end: nothing more reaches it.
            # The descriptor stays open until the run ends: the pool may still watch it, and a
            # number closed behind the selector's back would be reused by the next job's pipes.
            self.outbuf.clear()
            self.reader_gone = True

    def read_messages(self, limit: int | None = None, max_bytes: int | None = None) -> list[dict]:
        """Up to `limit` of the messages the job has sent, reading at most `max_bytes` from its pipe
        (None: no bound); the rest wait in `inbox`. A malformed stream marks a violation.

        The bounds keep a job that writes faster than the supervisor handles from holding the
        supervisor's loop (and every other job's deadline) for as long as it keeps writing."""
        msgs: list[dict] = []
        budget = math.inf if max_bytes is None else max_bytes
        while True:
            while self.inbox and (limit is None or len(msgs) < limit):
                msgs.append(self.inbox.popleft())
            if (limit is not None and len(msgs) >= limit) or budget <= 0:
                break
            if self.fds["from"] < 0 or self.channel_eof or self.violation:
                break
            try:
                data = os.read(self.fds["from"], _READ_CHUNK)
            except BlockingIOError:
                break
            if not data:
                self.channel_eof = True
                break
            budget -= len(data)
            self._feed(data)
        return msgs

    def _feed(self, data: bytes) -> None:
        """Decode what the job wrote, charging the supervisor's time for it to the job's own clock, on
        top of its running time (the pool credits the other jobs the same time, see `credit`)."""
        start = time.monotonic()
        try:
            self.inbox.extend(self.reader.feed(data))
        except protocol.ProtocolError as e:
            self.violate(str(e))
        spent = time.monotonic() - start
        self.decode_s += spent
        self.run_s += spent

    def credit(self, seconds: float) -> None:
        """The supervisor spent `seconds` on another job's messages: stop this job's clocks for that
        long, so that what one job costs the supervisor is charged to it and to nobody else."""
        if self.running_since is not None:
            self.running_since += seconds
        self.started += seconds

    def add_output(self, kind: str, data: bytes) -> None:
        tail, keep = self.tails[kind], self.config.output_tail_bytes
        self.nbytes[kind] += len(data)
        tail += data[-keep:]
        if len(tail) > 2 * keep:
            del tail[:-keep]

    # ----- events ----------------------------------------------------------------------------

    def violate(self, reason: str) -> None:
        if not self.violation:
            self.violation = f"protocol violation: {reason}"

    def set_result(self, msg: dict) -> None:
        answer, error = msg.get("answer"), msg.get("error")
        if self.result is not None:
            self.violate("sent a second result")
        elif isinstance(answer, str) and len(answer) <= self.config.max_answer_chars:
            self.result = {"answer": answer}
        elif isinstance(error, dict) and all(isinstance(error.get(k), str) for k in ("type", "message", "traceback")):
            self.result = {"error": error}
        else:
            self.violate("malformed or oversized result")

    def pause(self) -> None:
        """A brokered call is pending: stop the job's clock."""
        now = time.monotonic()
        if self.running_since is not None:
            self.run_s += now - self.running_since
        self.running_since = None
        self.waiting = True

    def charge_refused(self, calls: int) -> None:
        """A call refused through the job's own fault costs its call budget as if served (see
        broker.prompts_charged): bad calls are bounded by the budget, like good ones."""
        self.refused_calls += calls
        self.budget.calls = max(0, self.budget.calls - calls)

    def refuse_call(self, message: str, calls: int) -> None:
        """The Generator refused the brokered call (the job's own fault): charge it, restart the clock."""
        self.charge_refused(calls)
        self.waiting = False
        self.running_since = time.monotonic()
        self.send({"t": "refused", "kind": "generator", "message": message})

    def answer_call(self, completions: Sequence[Completion]) -> None:
        """Charge the budget, reply with the texts, restart the clock."""
        used = sum(len(c.token_ids) for c in completions)
        self.solver_calls += len(completions)
        self.prompt_tokens += sum(c.prompt_tokens for c in completions)
        self.completion_tokens += used
        self.budget.calls -= len(completions)
        self.budget.tokens -= used
        self.waiting = False
        self.running_since = time.monotonic()
        self.send({"t": "reply", "value": [c.text for c in completions]})

    def over_deadline(self, now: float) -> bool:
        return self.elapsed(now) > self.config.timeout_s or now - self.started > self.config.wall_budget_s

    def elapsed(self, now: float) -> float:
        return self.run_s + (now - self.running_since if self.running_since is not None else 0.0)

    def next_event(self, now: float) -> float:
        """Seconds until this run needs attention (deadline or kill grace), inf if none."""
        if self.has_exited:
            return math.inf
        if self.kill_sent_at is not None:
            return self.kill_sent_at + self.config.kill_grace_s - now
        wall = self.started + self.config.wall_budget_s - now
        if self.running_since is None:
            return wall
        return min(wall, self.config.timeout_s - self.elapsed(now))

    def time_out(self) -> None:
        now = time.monotonic()
        self.run_s = self.elapsed(now)
        self.running_since = None
        self.timed_out = True
        if self.run_s > self.config.timeout_s:
            self.timeout_reason = f"ran past the {self.config.timeout_s:g}s deadline and was killed"
        else:
            self.timeout_reason = (
                f"ran past the {self.config.wall_budget_s:g}s wall budget (solver calls included) and was killed"
            )

    def fail_infra(self, reason: str) -> None:
        if not self.infra:
            self.infra = reason

    def exited(self, status: int | None, maxrss_kb: int) -> None:
        if self.running_since is not None:
            self.run_s = self.elapsed(time.monotonic())
            self.running_since = None
        self.has_exited = True
        self.exit_status = status
        self.maxrss_kb = maxrss_kb

    @property
    def kill_sent(self) -> bool:
        return self.kill_sent_at is not None

    # ----- outcome ---------------------------------------------------------------------------

    def finish(self) -> JobResult:
        status, reason, answer, error = "crashed", "", None, None
        if self.infra:
            status, reason = "infra_error", self.infra
        elif self.timed_out and self.result is None:
            status, reason = "timeout", self.timeout_reason
        elif self.violation:
            reason = self.violation
        elif self.result is not None and "answer" in self.result:
            status, answer = "ok", self.result["answer"]
        elif self.result is not None:
            e = self.result["error"]
            status = "error"
            error = HarnessError(e["type"][:200], e["message"][:_MAX_ERROR_MESSAGE], e["traceback"][-_MAX_TRACEBACK:])
        else:
            reason = describe_exit(self.exit_status)
        return JobResult(
            tag=self.job.tag,
            status=status,
            answer=answer,
            score=None,
            error=error,
            reason=reason,
            stdout_tail=self._tail("out"),
            stderr_tail=self._tail("err"),
            stdout_bytes=self.nbytes["out"],
            stderr_bytes=self.nbytes["err"],
            solver_calls=self.solver_calls,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            tool_calls=self.tool_calls,
            run_s=round(self.run_s, 4),
            maxrss_kb=self.maxrss_kb,
        )

    def _tail(self, kind: str) -> str:
        return bytes(self.tails[kind][-self.config.output_tail_bytes :]).decode("utf-8", "replace")
