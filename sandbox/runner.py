"""What a job process does after `jail.confine`: run one harness on one question, report the outcome.

Runs inside the sandbox: standard library only. Nothing here is trusted by the supervisor: it
counts solver calls itself and scores the answer itself, so a harness that rewrites this module's
objects at run time gains nothing beyond what it could print.
"""

from __future__ import annotations

import _thread
import builtins
import linecache
import os
import sys
import traceback

from sandbox import protocol

HARNESS_FILENAME = "harness.py"  # How the harness's frames are named in tracebacks.


class SolverError(RuntimeError):
    """The supervisor refused a solver or tool call (bad arguments, unknown tool, tool failure)."""


class BudgetExceeded(SolverError):
    """This job has used up its solver-call or token budget."""


_REFUSALS = {"budget": BudgetExceeded, "invalid": SolverError, "tool": SolverError}


class _Channel:
    """Request/reply over the job channel; a lock keeps threads from interleaving frames."""

    def __init__(self, in_fd: int, out_fd: int):
        self._in, self._out = in_fd, out_fd
        self._lock = _thread.allocate_lock()  # Not threading: it would add at-fork hooks to the server.

    def request(self, msg: dict):
        with self._lock:
            protocol.send_from_job(self._out, msg)
            reply = protocol.recv_in_job(self._in)
        if reply is None:
            raise SolverError("the supervisor closed the job channel")
        if reply["t"] == "refused":
            raise _REFUSALS.get(reply.get("kind"), SolverError)(reply.get("message", "refused"))
        return reply.get("value")


class Solver:
    """The harness's only way to reach the solver LLM.

    `generate(prompt, **sampling) -> str` sends `prompt` as one user turn (or as raw text, per the
    pool's solver config) and returns the completion text. `generate_batch(prompts, **sampling)`
    does the same for many prompts in one call, which the supervisor batches with other jobs.
    Sampling keywords: max_new_tokens, temperature, top_p, top_k, stop, seed. Raises
    `BudgetExceeded` once the job's call or token budget is spent, `SolverError` on bad arguments.
    """

    def __init__(self, channel: _Channel):
        self._channel = channel

    def generate(self, prompt: str, **sampling) -> str:
        return self.generate_batch([prompt], **sampling)[0]

    def generate_batch(self, prompts: list[str], **sampling) -> list[str]:
        if isinstance(prompts, str):
            raise TypeError("generate_batch takes a list of prompts; use generate for one")
        return self._channel.request({"t": "generate", "prompts": list(prompts), "sampling": sampling})


def _tool(channel: _Channel, name: str):
    def call(*args, **kwargs):
        return channel.request({"t": "tool", "name": name, "args": list(args), "kwargs": kwargs})

    call.__name__ = call.__qualname__ = name
    return call


def _describe(exc: BaseException, max_frames: int) -> dict:
    """Type, message and the last `max_frames` frames, without this module's own frames."""
    try:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename != __file__]
        lines = traceback.format_list(frames[-max_frames:])
        lines += traceback.format_exception_only(type(exc), exc)
        return {"type": type(exc).__name__, "message": str(exc)[:2000], "traceback": "".join(lines)}
    except BaseException:  # noqa: BLE001 - an exception whose __str__ raises, for one.
        return {"type": type(exc).__name__, "message": "(the exception could not be printed)", "traceback": ""}


def run_job(in_fd: int, out_fd: int, max_frames: int, max_answer_chars: int) -> None:
    """Read the job, run `solve`, send the result, and leave without running any more Python."""
    exit_now = os._exit  # Bound before harness code runs, which may replace os._exit.
    channel = _Channel(in_fd, out_fd)
    job = protocol.recv_in_job(in_fd)
    if job is None or job.get("t") != "job":
        exit_now(3)
    code = job["code"]
    linecache.cache[HARNESS_FILENAME] = (len(code), None, code.splitlines(True), HARNESS_FILENAME)
    namespace = {"__name__": "harness", "__builtins__": builtins}
    namespace.update({name: _tool(channel, name) for name in job["tools"]})
    try:
        exec(compile(code, HARNESS_FILENAME, "exec"), namespace)
        solve = namespace.get("solve")
        if not callable(solve):
            raise NameError("the harness defines no function solve(question, solver)")
        answer = solve(job["question"], Solver(channel))
        if not isinstance(answer, str):
            raise TypeError(f"solve() must return str, got {type(answer).__name__}")
        if len(answer) > max_answer_chars:
            raise ValueError(f"answer of {len(answer)} characters exceeds the limit of {max_answer_chars}")
        result = {"t": "result", "answer": answer}
    except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt are harness errors too.
        result = {"t": "result", "error": _describe(exc, max_frames)}
    try:
        protocol.send_from_job(out_fd, result)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
    except BaseException:  # noqa: BLE001 - a closed channel or stream: the supervisor reports it.
        pass
    exit_now(0)
