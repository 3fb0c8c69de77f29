"""The supervisor's side of `solver.generate`: check, budget, batch across jobs, call the Generator.

Harness code never holds a socket to the solver. Its requests arrive on its job channel; the pool
turns each into a `Call` (validated sampling, budget applied) and the `Broker` runs batches of
calls from many jobs on one background thread, so deadlines keep being enforced meanwhile.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import queue
import threading
from typing import Sequence

from hljax.generate.types import Completion, Generator, SamplingParams
from sandbox.config import SolverConfig

_SAMPLING_KEYS = {
    "max_new_tokens": int,
    "temperature": (int, float),
    "top_p": (int, float),
    "top_k": int,
    "seed": int,
    "stop": (str, list),
}


class CallRefused(Exception):
    """A harness's call is refused; it sees SolverError (kind 'invalid'/'tool') or BudgetExceeded ('budget')."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


@dataclasses.dataclass
class Budget:
    """What one job may still use. Mutable: the pool charges it as calls complete."""

    calls: int
    tokens: int
    tool_calls: int

    @classmethod
    def of(cls, config: SolverConfig) -> Budget:
        return cls(config.max_calls, config.max_tokens, config.max_tool_calls)


@dataclasses.dataclass(frozen=True)
class Call:
    """One harness request for `len(prompts)` completions, ready to batch."""

    key: int  # The job run that asked.
    prompts: tuple[str, ...]
    sampling: SamplingParams


def _short(value, limit: int = 100) -> str:
    """`repr(value)`, cut to `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def make_call(key: int, msg: dict, config: SolverConfig, budget: Budget) -> Call:
    """Validate a `generate` message against the config and the job's budget; CallRefused if not."""
    prompts = msg.get("prompts")
    if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
        raise CallRefused("invalid", "prompts must be a non-empty list of strings")
    raw = msg.get("sampling")
    if not isinstance(raw, dict):
        raise CallRefused("invalid", "sampling must be keyword arguments")
    kwargs = {}
    for name, value in raw.items():
        kind = _SAMPLING_KEYS.get(name)
        if kind is None:
            # The job's own text is never echoed at length: refusals are sent back to it.
            raise CallRefused("invalid", f"unknown sampling argument {_short(name)}; allowed: {sorted(_SAMPLING_KEYS)}")
        if not isinstance(value, kind) or isinstance(value, bool):
            raise CallRefused("invalid", f"sampling argument {name}={_short(value)} has the wrong type")
        kwargs[name] = value
    if "stop" in kwargs:
        stop = kwargs["stop"]
        stop = [stop] if isinstance(stop, str) else stop
        if not all(isinstance(s, str) for s in stop):
            raise CallRefused("invalid", "stop must be a string or a list of strings")
        kwargs["stop"] = tuple(stop)
    if len(prompts) > budget.calls:
        raise CallRefused("budget", f"solver call budget spent: {len(prompts)} asked, {budget.calls} left")
    per_prompt = budget.tokens // len(prompts)
    if per_prompt < 1:
        raise CallRefused("budget", f"solver token budget spent: {budget.tokens} tokens left")
    try:
        sampling = dataclasses.replace(config.sampling, **kwargs)
        cap = min(sampling.max_new_tokens, config.max_new_tokens_cap, per_prompt)
        sampling = dataclasses.replace(sampling, max_new_tokens=cap)
    except ValueError as e:
        raise CallRefused("invalid", str(e)[:200]) from None
    return Call(key=key, prompts=tuple(prompts), sampling=sampling)


@dataclasses.dataclass(frozen=True)
class Served:
    """The Generator's answer to one `Call`: completions in prompt order, or the failure."""

    call: Call
    completions: tuple[Completion, ...] = ()
    failure: str = ""  # Non-empty: the Generator failed; an infrastructure error, not the harness's.
    # Non-empty: the Generator failed on this call alone while it served others of its batch: the
    # call's own prompts are at fault, so the harness is told (SolverError), as for a bad argument.
    refused: str = ""


class Broker:
    """Runs batches of calls on one background thread and signals completions on `wake_fd`."""

    def __init__(self, generator: Generator, config: SolverConfig, wake_fd: int):
        self._generator = generator
        self._config = config
        self._wake_fd = wake_fd
        self._inbox: queue.Queue[list[Call] | None] = queue.Queue()
        self._done: collections.deque[Served] = collections.deque()
        self._busy = False
        self._thread = threading.Thread(target=self._loop, name="sandbox-broker", daemon=True)
        self._thread.start()

    @property
    def generator(self) -> Generator:
        return self._generator

    @property
    def busy(self) -> bool:
        return self._busy

    def submit(self, calls: list[Call]) -> None:
        """Hand one batch to the thread; call only when not `busy`."""
        self._busy = True
        self._inbox.put(calls)

    def collect(self) -> list[Served]:
        """Completed calls since the last collect (in the supervisor's thread)."""
        out = []
        while self._done:
            out.append(self._done.popleft())
        return out

    def close(self) -> None:
        self._inbox.put(None)
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        while (calls := self._inbox.get()) is not None:
            groups: dict[SamplingParams, list[Call]] = collections.defaultdict(list)
            for call in calls:
                groups[call.sampling].append(call)
            served = [s for sampling, group in groups.items() for s in self._serve(sampling, group)]
            self._done.extend(served)
            self._busy = False
            try:
                os.write(self._wake_fd, b"x")
            except BlockingIOError:  # The pipe is full of earlier wake-ups: the supervisor will look.
                pass

    def _serve(self, sampling: SamplingParams, calls: Sequence[Call]) -> list[Served]:
        try:
            return self._complete(sampling, calls)
        except Exception as e:  # noqa: BLE001 - any Generator failure is reported, never raised here.
            if len(calls) == 1:
                return [Served(call=calls[0], failure=f"{type(e).__name__}: {e}")]
        # One prompt the Generator refuses fails its whole batch: retry each call alone, so that
        # the others are served and the failure lands on the call that caused it.
        alone = []
        for call in calls:
            try:
                alone += self._complete(sampling, [call])
            except Exception as e:  # noqa: BLE001
                alone.append(Served(call=call, failure=f"{type(e).__name__}: {e}"))
        if all(s.failure for s in alone):  # The Generator serves nobody: an infrastructure error.
            return alone
        return [dataclasses.replace(s, failure="", refused=s.failure) if s.failure else s for s in alone]

    def _complete(self, sampling: SamplingParams, calls: Sequence[Call]) -> list[Served]:
        """One Generator request for all of `calls`' prompts; raises whatever the Generator raises."""
        prompts = [p for call in calls for p in call.prompts]
        if self._config.prompt_mode == "chat":
            conversations = [[{"role": "user", "content": p}] for p in prompts]
            out = self._generator.chat(conversations, sampling, n=1, enable_thinking=self._config.enable_thinking)
        else:
            out = self._generator.generate(prompts, sampling, n=1)
        if len(out) != len(prompts) or any(len(c) != 1 for c in out):
            raise RuntimeError(f"Generator returned {len(out)} results for {len(prompts)} prompts")
        served, start = [], 0
        for call in calls:
            chunk = out[start : start + len(call.prompts)]
            start += len(call.prompts)
            served.append(Served(call=call, completions=tuple(c[0] for c in chunk)))
        return served
