"""The one generation interface the rest of hljax sees.

`LocalGenerator` (in-process JAX engine) and `SGLangGenerator` (HTTP) implement `Generator`.
Field names follow SGLang's `sampling_params` so a request maps onto its API one to one.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Literal, Mapping, Protocol, Sequence, runtime_checkable

Message = Mapping[str, str]  # {"role": "system" | "user" | "assistant", "content": str}
FinishReason = Literal["stop", "length", "abort"]


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How a config samples a model: the one block wherever a model is sampled (GRPO's proposals, state
    refreshes, adaptation, the teacher, and inside the solver's `SamplingParams`). Its keys sit in the
    block of what is sampled (`--config.grpo.temperature`, `--config.teacher.max_new_tokens`)."""

    max_new_tokens: int = 256  # Completion length cap.
    temperature: float = 1.0  # 0 means greedy.
    top_p: float = 1.0  # Nucleus sampling (1: off).
    top_k: int = -1  # -1 disables top-k, as in SGLang.

    def __post_init__(self):
        _check_sampling(self.max_new_tokens, self.temperature, self.top_p, self.top_k)

    def params(self, **request) -> SamplingParams:
        """These settings as one request's, with its own `request` fields (seed, stop, ...)."""
        return SamplingParams(**dataclasses.asdict(self), **request)


@dataclasses.dataclass(frozen=True)
class SamplingOverride:
    """Sampling that follows another block where a field is None (state refreshes follow GRPO's)."""

    max_new_tokens: int | None = None  # Completion length cap (None: the followed block's).
    temperature: float | None = None  # Sampling temperature (None: the followed block's).
    top_p: float | None = None  # Nucleus sampling (None: the followed block's).
    top_k: int | None = None  # Top-k, -1 off (None: the followed block's).

    def following(self, base: Sampling) -> SamplingOverride:
        """This override with every None field set to `base`'s value (a config keeps it: what is used)."""
        return dataclasses.replace(self, **{k: getattr(base, k) for k, v in dataclasses.asdict(self).items() if v is None})


def _check_sampling(max_new_tokens: int, temperature: float, top_p: float, top_k: int) -> None:
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if top_k == 0 or top_k < -1:
        raise ValueError(f"top_k must be -1 (off) or >= 1, got {top_k}")


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling knobs, SGLang's names and conventions."""

    max_new_tokens: int = Sampling.max_new_tokens  # Completion length cap.
    temperature: float = Sampling.temperature  # 0 means greedy.
    top_p: float = Sampling.top_p  # Nucleus sampling (1: off).
    top_k: int = Sampling.top_k  # -1 disables top-k, as in SGLang.
    stop: tuple[str, ...] = ()  # Strings that end a completion.
    stop_token_ids: tuple[int, ...] = ()  # Token ids that end a completion (besides EOS).
    seed: int | None = None  # Same seed, same prompt, same weights -> same tokens.
    # SGLang's: no stop token ends the completion (neither EOS nor stop_token_ids; stop strings still do).
    ignore_eos: bool = False
    min_new_tokens: int = 0  # Stop tokens are masked out (-inf logits) until this many were generated.

    def __post_init__(self):
        _check_sampling(self.max_new_tokens, self.temperature, self.top_p, self.top_k)
        if not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise ValueError(f"min_new_tokens must be in [0, max_new_tokens={self.max_new_tokens}], "
                             f"got {self.min_new_tokens}")

    def to_sglang(self) -> dict:
        """The `sampling_params` dict of SGLang's `/generate`."""
        out = {
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "stop": list(self.stop),
            "stop_token_ids": list(self.stop_token_ids),
        }
        if self.seed is not None:
            out["sampling_seed"] = self.seed
        if self.ignore_eos:
            out["ignore_eos"] = True
        if self.min_new_tokens:
            out["min_new_tokens"] = self.min_new_tokens
        return out


@dataclasses.dataclass(frozen=True)
class Completion:
    """One sampled continuation of one prompt."""

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...] | None  # Of the sampled tokens, log_softmax(logits / T); None if not asked.
    finish_reason: FinishReason
    prompt_tokens: int
    weight_version: str


class Generator(Protocol):
    """What produces proposer rollouts and solver answers."""

    def generate(
        self, prompts: Sequence[str], sampling: SamplingParams, *, n: int = 1, return_logprobs: bool = False
    ) -> list[list[Completion]]:
        """Raw-text prompts -> `n` completions per prompt, in prompt order."""
        ...

    def chat(
        self,
        conversations: Sequence[Sequence[Message]],
        sampling: SamplingParams,
        *,
        n: int = 1,
        return_logprobs: bool = False,
        enable_thinking: bool = False,
    ) -> list[list[Completion]]:
        """Conversations rendered with the model's chat template -> `n` completions each."""
        ...


class TrainableGenerator(Generator, Protocol):
    """A proposer GRPO can push new weights to: our engine (in place), an SGLang server
    (`/update_weights_from_disk`), sglang-jax run by hljax (a restart on the new folder)."""

    def update_weights_from_disk(self, path: str, weight_version: str | None = None) -> None:
        """Serve the HF folder `path` (same architecture) from the next request on."""
        ...

    def servers_without_weight_updates(self) -> list[str]:
        """Servers behind this generator that cannot take `update_weights_from_disk` ([]: all can)."""
        ...


@runtime_checkable
class InMemoryTrainable(TrainableGenerator, Protocol):
    """A proposer in the trainer's own process that takes new weights as arrays: no export, no reload
    from disk (the `colocated` rollout backend, hljax/generate/colocated.py)."""

    def update_weights_from_model(self, model, weight_version: str | None = None) -> None:
        """Serve `model`'s current weights (same architecture, addressable here) from the next batch on."""
        ...


def copy_seed(seed: int | None, i: int) -> int | None:
    """Seed of the i-th of n samples: copy 0 keeps the request's seed, the others get distinct ones."""
    if seed is None or i == 0:
        return seed
    return int.from_bytes(hashlib.blake2b(f"{seed}:{i}".encode(), digest_size=4).digest(), "little") % 2**31


def render_chat(tokenizer, conversation: Sequence[Message], enable_thinking: bool) -> str:
    """`conversation` in `tokenizer`'s chat template, ready for the assistant's turn."""
    return tokenizer.apply_chat_template(
        [dict(m) for m in conversation], tokenize=False, add_generation_prompt=True, enable_thinking=enable_thinking
    )
