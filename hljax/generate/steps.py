"""The jitted programs of batched generation and the state they pass: prefill distinct prompts, insert
prefilled rows into free decode slots, decode a chunk of steps, grow the slot batch.

`hljax.generate.engine.Engine` holds the weights and decides once whether the CPU kernels run
(`kernels`, passed to every program here); `hljax.generate.batcher.Batcher` drives these programs
between chunks. Both import this module; neither imports the other's internals.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx

from hljax.generate.programs import program
from hljax.generate.sampling import mask_tokens, row_keys, sample
from hljax.generate.types import FinishReason, SamplingParams
from hljax.models import ops, registry

NO_STOP = -1


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
    # Decode chunks the batch had run when this row joined it and when it finished (its batch's clock).
    joined_at: int = -1
    finished_at: int = -1


@flax.struct.dataclass
class RowParams:
    """What each row's request asks for; set when the row joins a slot."""

    prompt_len: jax.Array  # [B] int32: real prompt length = position of the first generated token
    seeds: jax.Array  # [B] uint32
    temperature: jax.Array  # [B] fp32
    top_k: jax.Array  # [B] int32
    top_p: jax.Array  # [B] fp32
    max_new: jax.Array  # [B] int32
    min_new: jax.Array  # [B] int32: stop ids are masked while fewer tokens were generated
    stop_ids: jax.Array  # [B, max_stop_ids] int32, -1 padded


@flax.struct.dataclass
class DecodeState:
    """The slot batch. Row b's prompt fills cache slots [width - prompt_len, width) (left-padded to its
    prefill's width); its j-th token is fed at slot width + j - 1, so rows at different steps coexist."""

    cache: list  # Per layer: qwen3.LayerCache (KV, [B, K, S, H]) or qwen3_5.LinearCache (conv + delta-rule state)
    last: jax.Array  # [B] int32: the token fed at the row's next step
    steps: jax.Array  # [B] int32: tokens generated so far by the row
    width: jax.Array  # [B] int32: the row's prefill width (its first generated token's slot)
    tokens: jax.Array  # [B, M] int32
    logprobs: jax.Array  # [B, M] fp32
    done: jax.Array  # [B] bool: finished, or a free slot
    kv_valid: jax.Array  # [B, S] bool: False at left-padding slots
    params: RowParams


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4))
def empty_state(cfg, batch: int, cache_len: int, max_new: int, max_stop_ids: int) -> DecodeState:
    """A DecodeState whose `batch` slots are all free.

    One program rather than an eager op per array: on a CPU each compiled program stays resident, and
    the eager zeros of a 28-layer cache were ~20 of them, 18 MB (measured with mallinfo2)."""
    zeros = lambda dt: jnp.zeros((batch,), dt)  # noqa: E731
    return DecodeState(
        cache=registry.init_cache(cfg, batch, cache_len),
        last=zeros(jnp.int32), steps=jnp.ones((batch,), jnp.int32), width=jnp.ones((batch,), jnp.int32),
        tokens=jnp.zeros((batch, max_new), jnp.int32), logprobs=jnp.zeros((batch, max_new), jnp.float32),
        done=jnp.ones((batch,), bool), kv_valid=jnp.ones((batch, cache_len), bool),
        params=RowParams(zeros(jnp.int32), zeros(jnp.uint32), zeros(jnp.float32), zeros(jnp.int32),
                         zeros(jnp.float32), zeros(jnp.int32), zeros(jnp.int32),
                         jnp.full((batch, max_stop_ids), NO_STOP, jnp.int32)),
    )


def return_freed_memory() -> None:
    """Hand the heap's free pages back to the OS (glibc's malloc_trim). On a CPU the weights live in
    malloc'd buffers: the originals that packing replaced, and the old weights after a swap, are freed
    but glibc keeps those pages, so the process would stay resident at twice the weights (measured on
    the Qwen3-0.6B shape: 4.57 GB after load, 2.58 GB after a trim, for 2.38 GB of weights)."""
    if jax.default_backend() != "cpu":
        return
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # Not glibc (musl, macOS): nothing to trim with.
        pass


def bucket(n: int, minimum: int, per_octave: int = 1) -> int:
    """The smallest bucket >= max(n, minimum): `per_octave` evenly spaced sizes in each (2^(k-1), 2^k],
    each a multiple of `minimum` (per_octave=1: powers of two)."""
    n = max(n, minimum, 1)
    p = 1 << (n - 1).bit_length()  # The power of two >= n.
    step = max(minimum, p // 2 // per_octave) if per_octave > 1 else p
    return min(p, -(-n // step) * step)


def sample_masked(p: RowParams, logits: jax.Array, steps: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Sample each row's token at its own step, its stop ids forbidden below min_new_tokens."""
    logits = mask_tokens(logits, p.stop_ids, steps < p.min_new)
    return sample(logits, row_keys(p.seeds, steps), p.temperature, p.top_k, p.top_p)


@program(static_argnums=(0, 5, 6))
def prefill(graphdef, params, tokens: jax.Array, positions: jax.Array, kv_valid: jax.Array, cache_dtype,
            kernels: bool):
    """tokens, positions, kv_valid: [U, W] left-padded distinct prompts -> (cache of W slots in
    `cache_dtype`, fp32 logits [U, V] at each prompt's last token).
    kernels: attention and the cache's writes by the CPU kernels (`ops.prefill_attention`)."""
    model = nnx.merge(graphdef, params)
    U, W = tokens.shape
    cache = registry.init_cache(model.cfg, U, W, cache_dtype)
    with ops.use_kernels() if kernels else contextlib.nullcontext():
        h, cache = model.decode_step(tokens, positions, kv_valid, cache, 0, prefill=True)
    return cache, model.logits(h[:, -1:])[:, 0]  # Left padding puts every row's last prompt token last.


@program(static_argnums=(0,), donate_argnums=(1,))
def insert(kernels: bool, st: DecodeState, cache, logits, kv_valid, src: jax.Array, dst: jax.Array,
            rows: RowParams) -> DecodeState:
    """Rows join free slots: slot dst[r] takes prefilled prompt src[r] (cache [U, ., W, .], logits [U, V],
    kv_valid [U, W]) and samples its first token (step 0) with its own params. dst = B pads (skipped).
    kernels: the cache rows are copied in place by the CPU kernel."""
    with ops.use_kernels() if kernels else contextlib.nullcontext():
        return _insert_rows(st, cache, logits, kv_valid, src, dst, rows)


def _insert_rows(st: DecodeState, cache, logits, kv_valid, src, dst, rows: RowParams) -> DecodeState:
    B, S = st.kv_valid.shape
    W = kv_valid.shape[1]
    tok, lp = sample_masked(rows, logits[src], jnp.zeros_like(src))
    stopped = jnp.any(tok[:, None] == rows.stop_ids, axis=-1) | (rows.max_new <= 1)
    put = lambda a, v: a.at[dst].set(v.astype(a.dtype), mode="drop")  # noqa: E731
    first = lambda v, a: jnp.zeros((len(src),) + a.shape[1:], a.dtype).at[:, 0].set(v)  # noqa: E731
    valid = jnp.concatenate([kv_valid[src], jnp.ones((len(src), S - W), bool)], axis=1)
    return st.replace(
        cache=registry.copy_rows(st.cache, cache, src, dst),
        last=put(st.last, tok),
        steps=put(st.steps, jnp.ones_like(src)),
        width=put(st.width, jnp.full_like(src, W)),
        tokens=put(st.tokens, first(tok, st.tokens)),
        logprobs=put(st.logprobs, first(lp, st.logprobs)),
        done=put(st.done, stopped),
        kv_valid=put(st.kv_valid, valid),
        params=jax.tree.map(put, st.params, rows),
    )


@program(static_argnums=(0, 2, 4), donate_argnums=(3,))
def decode_chunk(graphdef, params, kernels: bool, st: DecodeState, n_steps: int) -> DecodeState:
    """kernels: decode attention through the CPU kernel (params then hold `ops.pack_state` weights)."""
    model = nnx.merge(graphdef, params)
    with ops.use_kernels() if kernels else contextlib.nullcontext():
        return _decode_loop(model, st, n_steps)


def _decode_loop(model, st: DecodeState, n_steps: int) -> DecodeState:
    B, M = st.tokens.shape
    rows = jnp.arange(B)
    p = st.params

    def cond(carry):
        i, s = carry
        return (i < n_steps) & ~jnp.all(s.done)

    def body(carry):
        i, s = carry
        j, live = s.steps, ~s.done
        position = (p.prompt_len + j - 1)[:, None]
        h, cache = model.decode_step(s.last[:, None], position, s.kv_valid, s.cache, s.width + j - 1)
        tok, lp = sample_masked(p, model.logits(h)[:, 0], j)
        stopped = live & jnp.any(tok[:, None] == p.stop_ids, axis=-1)
        col = jnp.where(live, j, M)  # Finished and free rows write nothing (M is out of range).
        s = s.replace(
            cache=cache,
            last=jnp.where(live, tok, s.last),
            steps=j + live,
            tokens=s.tokens.at[rows, col].set(tok, mode="drop"),
            logprobs=s.logprobs.at[rows, col].set(lp, mode="drop"),
            done=s.done | stopped | (live & (j + 1 >= p.max_new)),
        )
        return i + 1, s

    return jax.lax.while_loop(cond, body, (jnp.int32(0), st))[1]


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def grow(st: DecodeState, B: int, S: int, M: int) -> DecodeState:
    """st with B slots, cache length S and M token columns; the new slots are free. One program, not
    an eager pad per array (see `empty_state`)."""
    old_B, old_S = st.kv_valid.shape
    old_M = st.tokens.shape[1]

    def pad(x, axes: dict[int, int], value=0):
        widths = [(0, axes.get(a, 0)) for a in range(x.ndim)]
        return jnp.pad(x, widths, constant_values=value)

    db, ds, dm = B - old_B, S - old_S, M - old_M

    p = st.params
    return DecodeState(
        cache=registry.grow_cache(st.cache, db, ds),
        last=pad(st.last, {0: db}),
        steps=pad(st.steps, {0: db}, 1),
        width=pad(st.width, {0: db}, 1),
        tokens=pad(st.tokens, {0: db, 1: dm}),
        logprobs=pad(st.logprobs, {0: db, 1: dm}),
        done=pad(st.done, {0: db}, True),
        kv_valid=pad(st.kv_valid, {0: db, 1: ds}, True),  # Generated tokens' slots are real.
        params=RowParams(**{k: pad(getattr(p, k), {0: db}, NO_STOP if k == "stop_ids" else 0)
                            for k in RowParams.__dataclass_fields__}),
    )
