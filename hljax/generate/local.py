"""`LocalGenerator`: the in-process JAX engine behind the `Generator` protocol."""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import transformers

from hljax import sharding as shd
from hljax.checkpoint import hf
from hljax.generate.engine import Engine, EngineConfig, Output, Request
from hljax.generate.types import Completion, Message, SamplingParams, copy_seed, render_chat


def expand(prompt_ids: Sequence[Sequence[int]], sampling: SamplingParams, n: int) -> list[Request]:
    """Prompt-major expansion (p0 x n, p1 x n, ...), the order SGLang returns parallel samples in."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return [
        Request(tuple(ids), SamplingParams(**{**sampling.__dict__, "seed": copy_seed(sampling.seed, j)}))
        for ids in prompt_ids
        for j in range(n)
    ]


def load_engine_weights(engine: Engine, path: str, weight_version: str | None = None) -> None:
    """Load an HF folder into `engine`; the architecture must not change. On any error the engine
    keeps serving its old weights."""
    old = engine.model_config
    # The chunk size is ours, not the checkpoint's: keep the served one.
    model = hf.load_hf(path, engine.mesh, dtype=old.dtype, param_dtype=old.param_dtype,
                       linear_chunk_size=old.linear_chunk_size)
    if model.cfg != old:
        diff = [k for k in old.__dataclass_fields__ if getattr(old, k) != getattr(model.cfg, k)]
        raise ValueError(f"{path}: architecture differs from the served model in {diff}")
    engine.set_model(model, weight_version)


class LocalGenerator:
    """Generator over an in-process `Engine` (the embedded default on CPU)."""

    def __init__(self, engine: Engine, tokenizer):
        if engine.tokenizer is None:
            raise ValueError("LocalGenerator needs an engine built with a tokenizer")
        self.engine = engine
        self.tokenizer = tokenizer

    @classmethod
    def from_pretrained(
        cls,
        path: str,
        mesh: jax.sharding.Mesh | None = None,
        config: EngineConfig = EngineConfig(),
        dtype=jnp.float32,
    ) -> LocalGenerator:
        mesh = mesh or shd.make_mesh()
        tokenizer = transformers.AutoTokenizer.from_pretrained(path)
        return cls(Engine(hf.load_hf(path, mesh, dtype=dtype), mesh, config, tokenizer), tokenizer)

    @property
    def weight_version(self) -> str:
        return self.engine.weight_version

    def generate(
        self, prompts: Sequence[str], sampling: SamplingParams, *, n: int = 1, return_logprobs: bool = False
    ) -> list[list[Completion]]:
        return self.generate_ids([self.tokenizer.encode(p) for p in prompts], sampling, n=n,
                                 return_logprobs=return_logprobs)

    def generate_ids(
        self, prompt_ids: Sequence[Sequence[int]], sampling: SamplingParams, *, n: int = 1,
        return_logprobs: bool = False,
    ) -> list[list[Completion]]:
        outputs = self._decode(expand(prompt_ids, sampling, n))
        version = self.engine.weight_version
        done = [_completion(o, len(prompt_ids[i // n]), version, return_logprobs) for i, o in enumerate(outputs)]
        return [done[i * n : (i + 1) * n] for i in range(len(prompt_ids))]

    def _decode(self, requests: list[Request]) -> list[Output]:
        """The requests' outputs, in order: one batch of the engine's per call (ColocatedGenerator:
        one batch shared by every caller)."""
        return self.engine.generate(requests)

    def chat(
        self,
        conversations: Sequence[Sequence[Message]],
        sampling: SamplingParams,
        *,
        n: int = 1,
        return_logprobs: bool = False,
        enable_thinking: bool = False,
    ) -> list[list[Completion]]:
        prompts = [render_chat(self.tokenizer, c, enable_thinking) for c in conversations]
        return self.generate(prompts, sampling, n=n, return_logprobs=return_logprobs)

    def update_weights_from_disk(self, path: str, weight_version: str | None = None) -> None:
        load_engine_weights(self.engine, path, weight_version)

    def servers_without_weight_updates(self) -> list[str]:
        return []  # The engine loads any checkpoint of its architecture in place.


def _completion(o: Output, prompt_tokens: int, version: str, with_logprobs: bool) -> Completion:
    return Completion(
        text=o.text,
        token_ids=tuple(o.token_ids),
        logprobs=tuple(o.logprobs) if with_logprobs else None,
        finish_reason=o.finish_reason,
        prompt_tokens=prompt_tokens,
        weight_version=version,
    )
