"""The supervisor's side of `solver.generate`: check, budget, batch across jobs, call the Generator.

Harness code never holds a socket to the solver. Its requests arrive on its job channel; the pool
turns each into a `Call` (validated sampling, budget applied) and the `Broker` runs batches of
calls from many jobs on one background thread, so deadlines keep being enforced meanwhile.
"""

from __future__ import annotations

import collections
import dataclasses
import math
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


# Sampling values every Generator can take. The engine holds seeds as uint32 and top_k as int32, and
# SGLang servers take seeds as int32: a value past these fails the whole Generator request, and with it
# every other job's calls in the same batch, so it is refused here, as the job's own error.
_MAX_SEED = 2**31 - 1
_MAX_TOP_K = 2**31 - 1
_MAX_TEMPERATURE = 1000.0  # Far past uniform sampling in practice; NaN and inf are refused.
# Every stop string is searched for after each decoded token of the row, in the Generator's loop that
# serves every job: their number and length are bounded.
_MAX_STOPS = 16
_MAX_STOP_CHARS = 256


def _short(value, limit: int = 100) -> str:
    """`repr(value)`, cut to `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def prompts_charged(msg: dict) -> int:
    """What a refused `generate` message costs the job's call budget: one call per prompt it asked for
    (one if it named none), as if served. A refusal is the job's own error and is never free: a job
    that sends bad calls over and over spends its budget, not the Generator's time or other jobs'."""
    prompts = msg.get("prompts")
    return max(1, len(prompts)) if isinstance(prompts, list) else 1


def _check_prompts(prompts, config: SolverConfig) -> None:
    if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
        raise CallRefused("invalid", "prompts must be a non-empty list of strings")
    if not all(prompts):
        raise CallRefused("invalid", "prompts must not be empty strings")  # The engine refuses an empty prompt.
    chars = sum(map(len, prompts))
    if chars > config.max_prompt_chars:
        raise CallRefused("invalid", f"prompts of {chars} characters exceed the limit of {config.max_prompt_chars}")


def _sampling_kwargs(raw) -> dict:
    """The harness's sampling keywords, typed and in range; CallRefused naming the first bad one."""
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
    _check_ranges(kwargs)
    if "stop" in kwargs:
        kwargs["stop"] = _stops(kwargs["stop"])
    return kwargs


def _check_ranges(kwargs: dict) -> None:
    """Values every Generator takes; SamplingParams checks the rest (top_p, max_new_tokens >= 1)."""
    bad = None
    if "seed" in kwargs and not 0 <= kwargs["seed"] <= _MAX_SEED:
        bad = f"seed must be in [0, {_MAX_SEED}]"
    elif "top_k" in kwargs and not (kwargs["top_k"] == -1 or 1 <= kwargs["top_k"] <= _MAX_TOP_K):
        bad = f"top_k must be -1 (off) or in [1, {_MAX_TOP_K}]"
    elif "temperature" in kwargs and not 0 <= kwargs["temperature"] <= _MAX_TEMPERATURE:  # NaN fails too.
        bad = f"temperature must be a finite number in [0, {_MAX_TEMPERATURE:g}]"
    elif "top_p" in kwargs and not math.isfinite(kwargs["top_p"]):
        bad = "top_p must be a finite number in (0, 1]"
    if bad:
        raise CallRefused("invalid", bad)


def _stops(stop) -> tuple[str, ...]:
    stop = [stop] if isinstance(stop, str) else stop
    if not all(isinstance(s, str) for s in stop):
        raise CallRefused("invalid", "stop must be a string or a list of strings")
    if len(stop) > _MAX_STOPS or not all(0 < len(s) <= _MAX_STOP_CHARS for s in stop):
        raise CallRefused("invalid", f"stop takes at most {_MAX_STOPS} strings of 1 to {_MAX_STOP_CHARS} characters")
    return tuple(stop)


def make_call(key: int, msg: dict, config: SolverConfig, budget: Budget) -> Call:
    """Validate a `generate` message against the config and the job's budget; CallRefused if not."""
    if budget.calls < 1:  # First: once spent, every call is BudgetExceeded, well-formed or not.
        raise CallRefused("budget", "solver call budget spent: 0 calls left")
    prompts = msg.get("prompts")
    _check_prompts(prompts, config)
    kwargs = _sampling_kwargs(msg.get("sampling"))
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
    # Non-empty: the Generator refused this call: it said the request itself is wrong, or it failed on
    # this call alone while it served others. The harness is told (SolverError), as for a bad argument.
    refused: str = ""


def is_request_error(error: Exception) -> bool:
    """Whether the Generator says the request itself is wrong, so that sending it again cannot help: an
    HTTP 4xx other than 429 from a server (`status`, as hljax.generate.http.ServerError carries it), or
    a ValueError (the engine's RequestError, a client's own argument checks)."""
    status = getattr(error, "status", None)
    if isinstance(status, int):
        return 400 <= status < 500 and status != 429
    return isinstance(error, ValueError)


Outcome = tuple[Completion, ...] | Exception  # A call's completions, or what the Generator raised on it.


class Broker:
    """Runs batches of calls on one background thread and signals completions on `wake_fd`.

    A job whose call the Generator refused is a suspect from then on: its later calls go to the
    Generator in requests of their own, so that they never fail, and split, other jobs' batches.
    """

    def __init__(self, generator: Generator, config: SolverConfig, wake_fd: int):
        self._generator = generator
        self._config = config
        self._wake_fd = wake_fd
        self._inbox: queue.Queue[list[Call] | None] = queue.Queue()
        self._done: collections.deque[Served] = collections.deque()
        self._busy = False
        self._suspects: set[int] = set()  # Keys of job runs with a refused call; only the thread touches it.
        self._has_served = False  # The Generator has answered a request: it works, so a request error names its call.
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
            outcomes = [o for group in self._groups(calls) for o in self._run(group[0].sampling, group)]
            self._done.extend(self._judge(outcomes))
            self._busy = False
            try:
                os.write(self._wake_fd, b"x")
            except BlockingIOError:  # The pipe is full of earlier wake-ups: the supervisor will look.
                pass

    def _groups(self, calls: list[Call]) -> list[list[Call]]:
        """One Generator request per sampling setting; a suspect's calls in requests of their own."""
        groups: dict[tuple, list[Call]] = collections.defaultdict(list)
        for call in calls:
            groups[(call.sampling, call.key if call.key in self._suspects else None)].append(call)
        return list(groups.values())

    def _run(self, sampling: SamplingParams, calls: list[Call]) -> list[tuple[Call, Outcome]]:
        """Each call with its completions, or the exception the Generator raised on it."""
        try:
            return list(zip(calls, self._complete(sampling, calls)))
        except Exception as e:  # noqa: BLE001 - any Generator failure is reported, never raised here.
            error = e
        if len(calls) == 1:
            return [(calls[0], error)]
        if is_request_error(error):
            # Some call of the batch is wrong: halve the batch until the wrong ones stand alone, so that a
            # bad call costs the others about log2(n) more requests rather than n.
            half = len(calls) // 2
            return self._run(sampling, calls[:half]) + self._run(sampling, calls[half:])
        # Anything else (a connection error, an HTTP 5xx): each call alone, as one prompt may still be
        # the cause; when the Generator serves nobody, `_judge` makes every failure an infra error.
        return [pair for call in calls for pair in self._run(sampling, [call])]

    def _judge(self, outcomes: list[tuple[Call, Outcome]]) -> list[Served]:
        """Whose fault each failure is. The call's, when the Generator says the request is wrong and has
        served requests before (a Generator that never worked raises ValueError for every call), or when
        it served other calls of this batch; otherwise the Generator's (an infrastructure error)."""
        served_some = any(not isinstance(o, Exception) for _, o in outcomes)
        self._has_served = self._has_served or served_some
        out = []
        for call, outcome in outcomes:
            if not isinstance(outcome, Exception):
                out.append(Served(call=call, completions=outcome))
                continue
            why = f"{type(outcome).__name__}: {outcome}"
            if served_some or (self._has_served and is_request_error(outcome)):
                self._suspects.add(call.key)
                out.append(Served(call=call, refused=why))
            else:
                out.append(Served(call=call, failure=why))
        return out

    def _complete(self, sampling: SamplingParams, calls: Sequence[Call]) -> list[tuple[Completion, ...]]:
        """One Generator request for all of `calls`' prompts: each call's completions, in call order.
        Raises whatever the Generator raises."""
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
            served.append(tuple(c[0] for c in chunk))
        return served
