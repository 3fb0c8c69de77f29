"""Batched generation for our NNX Qwen3 and Qwen3.5: one prefill of the left-padded batch, then a
jitted decode loop over a static cache (KV caches; for Qwen3.5 also the fixed-size Gated DeltaNet
states of its linear-attention layers, which the prefill leaves exactly as the unpadded row would).

Shapes are bucketed (batch, prompt width, new tokens and cache length to powers of two) so jit
compiles once per bucket, not per request. Decoding runs in chunks of `decode_chunk` steps inside a
`lax.while_loop` that exits early when every row is done; between chunks the host checks stop
strings, which need the tokenizer.

What runs where: on a CPU the projections (prefill and decode) and the decode steps' attention may
run on `hljax.kernels.cpu_decode` (`EngineConfig.cpu_kernels`; AVX-512 or AVX2 + FMA, fp32 or bf16
weights); the engine then holds the projection weights only in the kernels' packed layout. On
accelerators, and on CPUs where the kernels are off, everything is plain XLA.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import threading
from typing import Callable, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hljax import sharding as shd
from hljax.generate.sampling import row_keys, sample
from hljax.generate.types import FinishReason, SamplingParams
from hljax.kernels import cpu_decode
from hljax.models import dense, registry

log = logging.getLogger(__name__)

_NO_STOP = -1


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Static limits of the engine; they decide the jit buckets."""

    max_batch: int = 16  # Rows per forward pass; larger requests are split.
    max_seq_len: int = 4096  # Prompt + completion tokens per row (the cache length bound).
    min_bucket: int = 16  # Smallest prompt-width / new-token bucket.
    decode_chunk: int = 16  # Decode steps per jitted call between host-side stop-string checks.
    max_stop_ids: int = 8  # Stop token ids per row (request's + the model's EOS ids).
    # Projections and decode attention through `hljax.kernels.cpu_decode` (one CPU device with AVX-512F
    # or AVX2 + FMA; fp32 or bf16 weights, which makes bf16 the fast path there as on accelerators):
    # "auto" uses them when they can run here and logs why not otherwise, "on" raises if they cannot,
    # "off" keeps XLA's dot. With them the engine stores the projection weights packed (one copy).
    cpu_kernels: str = "auto"

    def __post_init__(self):
        if self.cpu_kernels not in ("auto", "on", "off"):
            raise ValueError(f"EngineConfig.cpu_kernels must be 'auto', 'on' or 'off', got {self.cpu_kernels!r}")


@dataclasses.dataclass(frozen=True)
class Request:
    prompt_ids: tuple[int, ...]
    sampling: SamplingParams


@dataclasses.dataclass(frozen=True)
class Output:
    token_ids: list[int]
    logprobs: list[float]  # log_softmax(logits / T) of each sampled token (T = 0 counts as 1).
    finish_reason: FinishReason
    matched: int | str | None  # The stop token id or stop string that ended the row.
    text: str | None  # Detokenized (stop string excluded) when the engine has a tokenizer.


class RequestError(ValueError):
    """A request the engine cannot serve (too long, bad token ids); servers answer it with a 400."""


@flax.struct.dataclass
class DecodeState:
    cache: list  # Per layer: qwen3.LayerCache (KV) or qwen3_5.LinearCache (conv + delta-rule state)
    last: jax.Array  # [B] int32: the token fed at the next step
    step: jax.Array  # [] int32: tokens generated so far
    tokens: jax.Array  # [B, M] int32
    logprobs: jax.Array  # [B, M] fp32
    done: jax.Array  # [B] bool
    prompt_len: jax.Array  # [B] int32: real prompt length = position of the first generated token
    kv_valid: jax.Array  # [B, S] bool: False at left-padding slots
    seeds: jax.Array  # [B] uint32
    temperature: jax.Array  # [B] fp32
    top_k: jax.Array  # [B] int32
    top_p: jax.Array  # [B] fp32
    max_new: jax.Array  # [B] int32
    stop_ids: jax.Array  # [B, max_stop_ids] int32, -1 padded


def _bucket(n: int, minimum: int) -> int:
    return max(minimum, 1 << max(0, math.ceil(math.log2(max(n, 1)))))


def _sample_step(st: DecodeState, logits: jax.Array, step: jax.Array) -> tuple[jax.Array, jax.Array]:
    return sample(logits, row_keys(st.seeds, step), st.temperature, st.top_k, st.top_p)


@functools.partial(jax.jit, static_argnums=(0,), donate_argnums=(2,))
def _prefill(graphdef, params, st: DecodeState, tokens: jax.Array, positions: jax.Array) -> DecodeState:
    """tokens, positions: [B, W] left-padded prompts."""
    model = nnx.merge(graphdef, params)
    h, cache = model.decode_step(tokens, positions, st.kv_valid, st.cache, 0, prefill=True)
    logits = model.logits(h[:, -1:])[:, 0]  # Left padding puts every row's last prompt token last.
    tok, lp = _sample_step(st, logits, jnp.int32(0))
    stopped = jnp.any(tok[:, None] == st.stop_ids, axis=-1)
    return st.replace(
        cache=cache,
        last=tok,
        step=jnp.int32(1),
        tokens=st.tokens.at[:, 0].set(tok),
        logprobs=st.logprobs.at[:, 0].set(lp),
        done=st.done | stopped | (st.max_new <= 1),
    )


@functools.partial(jax.jit, static_argnums=(0, 2, 4, 5), donate_argnums=(3,))
def _decode_chunk(graphdef, params, kernels: bool, st: DecodeState, width: int, n_steps: int) -> DecodeState:
    """kernels: decode attention through the CPU kernel (params then hold `dense.pack_state` weights)."""
    model = nnx.merge(graphdef, params)
    with dense.use_kernels() if kernels else contextlib.nullcontext():
        return _decode_loop(model, st, width, n_steps)


def _decode_loop(model, st: DecodeState, width: int, n_steps: int) -> DecodeState:
    M = st.tokens.shape[1]

    def cond(carry):
        i, s = carry
        return (i < n_steps) & (s.step < M) & ~jnp.all(s.done)

    def body(carry):
        i, s = carry
        j = s.step
        position = (s.prompt_len + j - 1)[:, None]
        h, cache = model.decode_step(s.last[:, None], position, s.kv_valid, s.cache, width + j - 1)
        tok, lp = _sample_step(s, model.logits(h)[:, 0], j)
        tok = jnp.where(s.done, 0, tok)
        lp = jnp.where(s.done, 0.0, lp)
        stopped = ~s.done & jnp.any(tok[:, None] == s.stop_ids, axis=-1)
        s = s.replace(
            cache=cache,
            last=tok,
            step=j + 1,
            tokens=jax.lax.dynamic_update_slice_in_dim(s.tokens, tok[:, None], j, axis=1),
            logprobs=jax.lax.dynamic_update_slice_in_dim(s.logprobs, lp[:, None], j, axis=1),
            done=s.done | stopped | (j + 1 >= s.max_new),
        )
        return i + 1, s

    return jax.lax.while_loop(cond, body, (jnp.int32(0), st))[1]


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

    def set_model(self, model: registry.Model, weight_version: str | None = None) -> None:
        """Swap weights atomically (a batch in flight finishes on the old ones); jit caches stay valid
        when the architecture is the same. weight_version=None keeps the current version label."""
        graphdef, params = nnx.split(model)
        if self._use_kernels(params):
            # The packed weights replace the originals: the engine holds one copy.
            params = dense.pack_state(params, "embed" if model.cfg.tie_word_embeddings else None)
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
        elif not dense.kernel_weights(params):
            reason = "the model has no fp32 or bf16 projection weights"
        else:
            reason = cpu_decode.availability()
        if reason is not None and mode == "on":
            raise cpu_decode.KernelUnavailable(f"EngineConfig.cpu_kernels='on' but {reason}")
        self.kernels = reason is None
        log.info("engine decode steps: %s", "hljax CPU kernels" if self.kernels else f"XLA only ({reason})")
        return self.kernels

    def generate(self, requests: Sequence[Request]) -> list[Output]:
        """One Output per request, in request order."""
        self.validate(requests)
        order = sorted(range(len(requests)), key=lambda i: len(requests[i].prompt_ids))
        outputs: list[Output | None] = [None] * len(requests)
        with self._lock:
            graphdef, params, kernels = self._graphdef, self._params, bool(self.kernels)
        for start in range(0, len(order), self.config.max_batch):
            group = order[start : start + self.config.max_batch]
            for i, out in zip(group, self._generate_batch(graphdef, params, kernels, [requests[i] for i in group])):
                outputs[i] = out
        return outputs

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
        total = len(r.prompt_ids) + r.sampling.max_new_tokens
        if total > self.config.max_seq_len:
            raise RequestError(
                f"request {i}: prompt of {len(r.prompt_ids)} tokens + max_new_tokens {r.sampling.max_new_tokens} "
                f"exceeds the context of {self.config.max_seq_len} tokens"
            )
        if len(set(r.sampling.stop_token_ids) | set(cfg.eos_token_ids)) > self.config.max_stop_ids:
            raise RequestError(f"request {i}: more than {self.config.max_stop_ids} stop token ids")

    def _batch_size(self, n: int) -> int:
        shard = shd.axes_size(self.mesh, ("data", "fsdp"))
        b = max(_bucket(n, 1), shard)
        return -(-b // shard) * shard

    def _generate_batch(self, graphdef, params, kernels: bool, requests: list[Request]) -> list[Output]:
        cfg, ecfg = self.model_config, self.config
        n = len(requests)
        B = self._batch_size(n)
        width = _bucket(max(len(r.prompt_ids) for r in requests), ecfg.min_bucket)
        M = _bucket(max(r.sampling.max_new_tokens for r in requests), ecfg.min_bucket)
        S = _bucket(width + M, ecfg.min_bucket)
        pad_rows = [Request((0,), SamplingParams(max_new_tokens=1, temperature=0.0))] * (B - n)
        rows = requests + pad_rows

        tokens = np.zeros((B, width), np.int32)
        positions = np.zeros_like(tokens)
        kv_valid = np.ones((B, S), bool)
        stop_ids = np.full((B, ecfg.max_stop_ids), _NO_STOP, np.int32)
        for b, r in enumerate(rows):
            L = len(r.prompt_ids)
            tokens[b, width - L : width] = r.prompt_ids
            positions[b, width - L : width] = np.arange(L)
            kv_valid[b, : width - L] = False
            ids = sorted(set(r.sampling.stop_token_ids) | set(cfg.eos_token_ids))
            stop_ids[b, : len(ids)] = ids
        seeds = [r.sampling.seed if r.sampling.seed is not None else int(self._rng.integers(2**31)) for r in rows]

        with shd.use_mesh(self.mesh):
            st = DecodeState(
                cache=registry.init_cache(cfg, B, S),
                last=jnp.zeros((B,), jnp.int32),
                step=jnp.int32(0),
                tokens=jnp.zeros((B, M), jnp.int32),
                logprobs=jnp.zeros((B, M), jnp.float32),
                done=jnp.asarray([False] * n + [True] * (B - n)),
                prompt_len=jnp.asarray([len(r.prompt_ids) for r in rows], jnp.int32),
                kv_valid=jnp.asarray(kv_valid),
                seeds=jnp.asarray(np.asarray(seeds, np.uint32)),
                temperature=jnp.asarray([r.sampling.temperature for r in rows], jnp.float32),
                top_k=jnp.asarray([r.sampling.top_k for r in rows], jnp.int32),
                top_p=jnp.asarray([r.sampling.top_p for r in rows], jnp.float32),
                max_new=jnp.asarray([r.sampling.max_new_tokens for r in rows], jnp.int32),
                stop_ids=jnp.asarray(stop_ids),
            )
            st = _prefill(graphdef, params, st, jnp.asarray(tokens), jnp.asarray(positions))
            stop_strings = [r.sampling.stop for r in rows]
            while not bool(jnp.all(st.done)) and int(st.step) < M:
                st = _decode_chunk(graphdef, params, kernels, st, width, ecfg.decode_chunk)
                if any(stop_strings) and self.tokenizer is not None:
                    st = st.replace(done=st.done | jnp.asarray(self._stop_string_hits(st, stop_strings)))
        toks, lps = np.asarray(st.tokens), np.asarray(st.logprobs)
        return [self._finish(toks[b], lps[b], r, set(stop_ids[b]) - {_NO_STOP}) for b, r in enumerate(requests)]

    def _stop_string_hits(self, st: DecodeState, stop_strings) -> np.ndarray:
        toks, done, step = np.asarray(st.tokens), np.asarray(st.done), int(st.step)
        hits = np.zeros(len(stop_strings), bool)
        for b, stops in enumerate(stop_strings):
            if stops and not done[b]:
                text = self.tokenizer.decode(toks[b, :step].tolist(), skip_special_tokens=True)
                hits[b] = any(s in text for s in stops)
        return hits

    def _finish(self, toks: np.ndarray, lps: np.ndarray, r: Request, stop_ids: set[int]) -> Output:
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


def _first_stop(text: str, stops: Sequence[str]) -> tuple[int, str] | None:
    """(index, stop string) of the earliest stop string in `text`, or None."""
    found = [(text.find(s), s) for s in stops if s and s in text]
    return min(found) if found else None
