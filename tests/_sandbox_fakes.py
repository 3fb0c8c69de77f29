"""A deterministic stand-in for the solver `Generator`, for sandbox tests (the real engine is issue 3)."""

from __future__ import annotations

import threading
import time

from hljax.generate.types import Completion, SamplingParams


class EchoGenerator:
    """Implements the `Generator` protocol: the completion is "echo:" + the prompt's last user turn.

    One token per whitespace-separated word of the completion, cut to `max_new_tokens`;
    prompt_tokens is the prompt's word count. Records every request, so tests can check batching.
    """

    def __init__(self, delay_s: float = 0.0, fail: bool = False, refuse: str = "", max_seed: int | None = None):
        self.delay_s = delay_s
        self.fail = fail
        self.refuse = refuse  # Non-empty: a request with a prompt containing it raises, the whole request.
        # Like the engine, which holds seeds as uint32: a larger one fails the whole request (OverflowError).
        self.max_seed = max_seed
        self.requests: list[tuple[str, int, SamplingParams]] = []  # (method, batch size, sampling)
        self.prompts: list[tuple[str, ...]] = []  # Each request's prompts.
        self._lock = threading.Lock()

    def _complete(self, prompt: str, sampling: SamplingParams) -> Completion:
        words = ("echo:" + prompt).split()[: sampling.max_new_tokens]
        return Completion(
            text=" ".join(words),
            token_ids=tuple(range(len(words))),
            logprobs=None,
            finish_reason="stop",
            prompt_tokens=len(prompt.split()),
            weight_version="fake",
        )

    def _serve(self, method: str, prompts: list[str], sampling: SamplingParams, n: int) -> list[list[Completion]]:
        with self._lock:
            self.requests.append((method, len(prompts), sampling))
            self.prompts.append(tuple(prompts))
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.fail:
            raise ConnectionError("solver server unreachable")
        if self.max_seed is not None and sampling.seed is not None and sampling.seed > self.max_seed:
            raise OverflowError(f"Python integer {sampling.seed} out of bounds for uint32")
        if self.refuse and any(self.refuse in p for p in prompts):
            raise ValueError(f"prompt refused: contains {self.refuse!r}")
        return [[self._complete(p, sampling) for _ in range(n)] for p in prompts]

    def generate(self, prompts, sampling, *, n=1, return_logprobs=False):
        return self._serve("generate", list(prompts), sampling, n)

    def chat(self, conversations, sampling, *, n=1, return_logprobs=False, enable_thinking=False):
        return self._serve("chat", [c[-1]["content"] for c in conversations], sampling, n)
