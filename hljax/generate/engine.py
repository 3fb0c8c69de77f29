"""Batched generation for our NNX Qwen3 and Qwen3.5 with continuous batching and shared prefixes.

A batch is a fixed set of decode slots over a static cache (KV caches; for Qwen3.5 also the fixed-size
Gated DeltaNet states). Each distinct prompt is prefilled once (left-padded with other new prompts,
which leaves Qwen3.5's states exactly as the unpadded row would) and its cache copied into the slot
of every sample that asks for it. Decoding runs in chunks of `decode_chunk` steps inside a
`lax.while_loop`, every row at its own step and cache slot; between chunks the host checks stop
strings (they need the tokenizer), retires finished rows and admits waiting ones into the free slots
(`hljax.generate.batcher.Batcher`; the jitted programs are in `hljax.generate.steps`).

Shapes are bucketed (slots, prompt width, cache length, new tokens) so jit compiles once per bucket,
not per request: batch sizes to powers of two, lengths to `prompt_buckets_per_octave` sizes between
consecutive powers of two.

What runs where: on a CPU the projections and the embedding lookup (prefill and decode), the decode
steps' attention and KV-cache writes, and the copies of prefilled rows into the decode cache may run
on `hljax.kernels.cpu_decode` (`EngineConfig.cpu_kernels`; AVX-512 or AVX2 + FMA, fp32 or bf16
weights); the engine then holds the projection weights only in the kernels' packed layout and
computes activations in fp32 (bf16 weights stay bf16, and so does their KV cache).
On accelerators, and on CPUs where the kernels are off, everything is plain XLA in the model's dtypes.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hljax import sharding as shd
from hljax.generate.batcher import Batcher
from hljax.generate.steps import Output, Request, bucket  # noqa: F401 (Output: importers take it from here)
from hljax.generate.types import FinishReason, SamplingParams
from hljax.kernels import cpu_decode
from hljax.models import ops, registry

log = logging.getLogger(__name__)
_LOGGED_CHOICES: set[str] = set()


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Static limits of the engine; they decide the jit buckets."""

    max_batch: int = 16  # Decode slots: rows decoded together; more wait and join as slots free up.
    # Prompt + completion tokens per row, capped by the model's max_position_embeddings (SGLang's
    # --context-length); None: the model's. Longer requests are refused, naming both numbers.
    max_seq_len: int | None = 4096
    min_bucket: int = 16  # Smallest prompt-width / cache / new-token bucket; every length bucket is a multiple.
    # Length buckets between consecutive powers of two (4: 64, 80, 96, 112, 128, ...): more means less
    # padding (a 65-token prompt costs 80 slots, not 128) and more compilations (one per bucket).
    prompt_buckets_per_octave: int = 4
    decode_chunk: int = 16  # Decode steps per jitted call: the host checks stop strings and admits rows between.
    max_stop_ids: int = 8  # Stop token ids per row (request's + the model's EOS ids).
    # Prefill each distinct prompt once and copy its cache to every row (the n samples of a request,
    # identical prompts across requests) that asks for it; False prefills every row (for comparison).
    share_prefixes: bool = True
    # Projections and decode attention through `hljax.kernels.cpu_decode` (one CPU device with AVX-512F
    # or AVX2 + FMA; fp32 or bf16 weights, which makes bf16 the fast path there as on accelerators):
    # "auto" uses them when they can run here and logs why not otherwise, "on" raises if they cannot,
    # "off" keeps XLA's dot. With them the engine stores the projection weights packed (one copy).
    cpu_kernels: str = "auto"

    def __post_init__(self):
        if self.cpu_kernels not in ("auto", "on", "off"):
            raise ValueError(f"EngineConfig.cpu_kernels must be 'auto', 'on' or 'off', got {self.cpu_kernels!r}")
        if self.prompt_buckets_per_octave < 1:
            raise ValueError(f"EngineConfig.prompt_buckets_per_octave must be >= 1, got {self.prompt_buckets_per_octave}")


class RequestError(ValueError):
    """A request the engine cannot serve (too long, bad token ids); servers answer it with a 400."""


@dataclasses.dataclass
class EngineStats:
    """Counters since the engine started; `prompt_tokens_prefilled` < `prompt_tokens_received` when
    prompts were shared (n samples, identical prompts)."""

    rows: int = 0  # Completions finished.
    prompt_tokens_received: int = 0  # Prompt tokens of every row admitted.
    prompt_tokens_prefilled: int = 0  # Prompt tokens actually run through a prefill.
    prefills: int = 0  # Prefill calls.
    decode_chunks: int = 0
    generated_tokens: int = 0


class Engine:
    """Generates for a batch of token-id requests with our JAX Qwen3 / Qwen3.5 on a mesh."""

    def __init__(self, model: registry.Model, mesh: jax.sharding.Mesh, config: EngineConfig = EngineConfig(), tokenizer=None):
        self.config = config
        self.mesh = mesh
        self.tokenizer = tokenizer
        self._lock = threading.Lock()
        self.weight_version = "0"
        self.kernels: bool | None = None  # Decode through hljax.kernels.cpu_decode; set by the first model.
        self.set_model(model)
        self._rng = np.random.default_rng()
        self.stats = EngineStats()
        self._stats_lock = threading.Lock()

    def set_model(self, model: registry.Model, weight_version: str | None = None) -> None:
        """Swap weights atomically (a batch in flight finishes on the old ones); jit caches stay valid
        when the architecture is the same. weight_version=None keeps the current version label."""
        graphdef, params = nnx.split(model)
        if self._use_kernels(params):
            # The packed weights replace the originals: the engine holds one copy.
            params = ops.pack_state(params, "embed")
            graphdef = _fp32_activations(model.cfg, graphdef, self.mesh)
        with self._lock:
            self.model_config = model.cfg
            self._graphdef, self._params = graphdef, params
            if weight_version is not None:
                self.weight_version = str(weight_version)

    def _use_kernels(self, params) -> bool:
        """Whether decode steps go through the CPU kernels; decided once per engine."""
        if self.kernels is not None:
            return self.kernels
        mode = self.config.cpu_kernels
        reason = None
        if mode == "off":
            reason = "EngineConfig.cpu_kernels='off'"
        elif self.mesh.devices.size != 1:
            reason = f"the mesh has {self.mesh.devices.size} devices (the kernels run on one)"
        elif not ops.kernel_weights(params):
            reason = "the model has no fp32 or bf16 projection weights"
        else:
            reason = cpu_decode.availability()
        if reason is not None and mode == "on":
            raise cpu_decode.KernelUnavailable(f"EngineConfig.cpu_kernels='on' but {reason}")
        self.kernels = reason is None
        choice = "hljax CPU kernels" if self.kernels else f"XLA only ({reason})"
        if choice not in _LOGGED_CHOICES:  # A trainer starts several engines: say it once per process.
            _LOGGED_CHOICES.add(choice)
            log.info("engine decode steps: %s", choice)
        return self.kernels

    def generate(self, requests: Sequence[Request]) -> list[Output]:
        """One Output per request, in request order; rows beyond `max_batch` join as slots free up."""
        self.validate(requests)
        batcher = Batcher(self)
        ticket = batcher.add(requests)
        while not ticket.done:
            batcher.step()
        return ticket.outputs

    def snapshot(self):
        """(graphdef, params, kernels, weight_version) of the weights now served; a batch keeps its snapshot."""
        with self._lock:
            return self._graphdef, self._params, bool(self.kernels), self.weight_version

    @property
    def context_length(self) -> int:
        """Prompt + completion tokens a row may have: max_position_embeddings capped by max_seq_len."""
        cap = self.config.max_seq_len
        return min(self.model_config.max_position_embeddings, cap) if cap else self.model_config.max_position_embeddings

    def count(self, **increments: int) -> None:
        with self._stats_lock:
            for k, v in increments.items():
                setattr(self.stats, k, getattr(self.stats, k) + v)

    def stop_ids(self, sampling: SamplingParams) -> tuple[int, ...]:
        """Token ids that end a row: the request's and the model's EOS ids, none under ignore_eos (SGLang's rule)."""
        if sampling.ignore_eos:
            return ()
        return tuple(sorted(set(sampling.stop_token_ids) | set(self.model_config.eos_token_ids)))

    def new_seed(self) -> int:
        return int(self._rng.integers(2**31))

    def validate(self, requests: Sequence[Request]) -> None:
        """Raise RequestError naming the first request the engine cannot serve."""
        for i, r in enumerate(requests):
            self._validate_one(i, r)

    def _validate_one(self, i: int, r: Request) -> None:
        cfg = self.model_config
        if not r.prompt_ids:
            raise RequestError(f"request {i}: empty prompt")
        if min(r.prompt_ids) < 0 or max(r.prompt_ids) >= cfg.vocab_size:
            raise RequestError(f"request {i}: token ids must be in [0, {cfg.vocab_size})")
        # SGLang's wording, which clients parse for the numbers.
        n, m, context = len(r.prompt_ids), r.sampling.max_new_tokens, self.context_length
        if n >= context:
            raise RequestError(f"request {i}: The input ({n} tokens) is longer than the model's context length "
                               f"({context} tokens).")
        if n + m > context:
            raise RequestError(
                f"request {i}: Requested token count exceeds the model's maximum context length of {context} tokens. "
                f"You requested a total of {n + m} tokens: {n} tokens from the input messages and {m} tokens for "
                "the completion. Please reduce the number of tokens in the input messages or the completion to fit "
                "within the limit.")
        if len(set(r.sampling.stop_token_ids) | set(cfg.eos_token_ids)) > self.config.max_stop_ids:
            raise RequestError(f"request {i}: more than {self.config.max_stop_ids} stop token ids")

    def batch_size(self, n: int) -> int:
        """Slots for n rows: a power of two, a multiple of the mesh's batch shards."""
        shard = shd.axes_size(self.mesh, ("data", "fsdp"))
        b = max(bucket(n, 1), shard)
        return -(-b // shard) * shard

    def length_bucket(self, n: int) -> int:
        return bucket(n, self.config.min_bucket, self.config.prompt_buckets_per_octave)

    def stop_string_hit(self, token_ids: list[int], stops: Sequence[str]) -> bool:
        text = self.tokenizer.decode(token_ids, skip_special_tokens=True)
        return any(s in text for s in stops)

    def finish(self, toks: np.ndarray, lps: np.ndarray, r: Request) -> Output:
        """A finished row's generated tokens and logprobs -> its Output (cut at a stop id or stop string)."""
        stop_ids = set(self.stop_ids(r.sampling))
        n = min(r.sampling.max_new_tokens, len(toks))
        ids = toks[:n].tolist()
        reason: FinishReason = "length"
        matched: int | str | None = None
        for k, t in enumerate(ids):
            if t in stop_ids:
                ids, reason, matched = ids[: k + 1], "stop", t
                break
        text = None
        if self.tokenizer is not None:
            decode: Callable[[list[int]], str] = lambda x: self.tokenizer.decode(x, skip_special_tokens=True)
            text = decode(ids)
            hit = _first_stop(text, r.sampling.stop)
            if hit is not None:
                # Keep the fewest tokens whose text contains the stop string; the text ends before it.
                k = next(k for k in range(1, len(ids) + 1) if _first_stop(decode(ids[:k]), (hit[1],)) is not None)
                ids, reason, matched, text = ids[:k], "stop", hit[1], text[: hit[0]]
        return Output(ids, lps[: len(ids)].tolist(), reason, matched, text)


def _fp32_activations(cfg, graphdef, mesh):
    """The graph of `cfg`'s model computing in fp32, for weights in any dtype; `graphdef` if it does.

    With the CPU kernels the activations are fp32 whatever the model's compute dtype: the kernels
    multiply in fp32 anyway, and XLA:CPU runs bf16 elementwise ops (norms, rotary, SwiGLU, residuals)
    by converting every operand. Measured on 28 layers of the Qwen3-0.6B shape at batch 8: bf16
    weights decode at 134 ms a step with bf16 activations, 73 ms with fp32 ones (fp32 weights: 98 ms).
    The KV cache stays in the model's compute dtype (the module docstring), so bf16 halves what
    attention reads, as on an accelerator."""
    if jnp.dtype(cfg.dtype) == jnp.float32:
        return graphdef
    return _fp32_graphdef(dataclasses.replace(cfg, dtype=jnp.float32), mesh)


@functools.lru_cache(maxsize=4)
def _fp32_graphdef(cfg32, mesh):
    """Built once per config: tracing the model takes ~2.5 s on the 0.6B shape, and set_model runs
    at every weight swap of a training run."""
    with shd.use_mesh(mesh):
        abstract = nnx.eval_shape(lambda: registry.model_class(cfg32)(cfg32, rngs=nnx.Rngs(0)))
    return nnx.split(abstract)[0]


def _first_stop(text: str, stops: Sequence[str]) -> tuple[int, str] | None:
    """(index, stop string) of the earliest stop string in `text`, or None."""
    found = [(text.find(s), s) for s in stops if s and s in text]
    return min(found) if found else None
