"""The operations whose implementation depends on where the model runs: projections, attention,
KV-cache writes and row copies, the embedding lookup and the output logits. This module alone
decides between XLA and the CPU decode kernels (`hljax.kernels.cpu_decode`); the model code calls
these functions and never learns which ran.

Every projection weight is an `nnx.Param` with a `dense_in` metadata field: its first `dense_in`
dimensions are contracted (q_proj [D, N, H] has 1, o_proj [N, H, D] has 2). `dense` multiplies
through the weight viewed as a 2D matrix.

On a CPU the generation engine replaces these weights by their packed form (`pack_state`): one
layout, not a second copy. A packed weight carries `packed_shape` (its natural shape) in its
metadata, and `dense` sends every product through it to the kernel (decode steps and prefill alike;
the kernel is a GEMM over contiguous column panels). The token embedding stays [V, D] and is marked
`kernel_rows`: `embed_lookup` reads rows from it through the kernel and, when it is tied, `logits`
reads it row by row as the output projection. The engine traces its decode steps inside
`use_kernels()`, which also sends one-token attention, per-row cache writes and prefilled-row copies
to the kernels. The training path never packs, and accelerators run everything through XLA.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from typing import Iterator

import jax
import jax.numpy as jnp
from flax import nnx

from hljax import sharding as shd
from hljax.kernels import cpu_attention, cpu_decode

# Finite so fully masked rows (left padding) give a uniform softmax instead of NaN.
MASKED = -1e30

_ATTENTION: contextvars.ContextVar[bool] = contextvars.ContextVar("hljax_kernel_attention", default=False)


def dense_in(w: nnx.Variable) -> int | None:
    """How many leading dims of `w` a projection contracts, or None if `w` is not a projection weight."""
    return w.get_metadata().get("dense_in")


def packed_shape(w: nnx.Variable) -> tuple[int, ...] | None:
    """The natural shape of a weight `pack_state` packed, else None."""
    return w.get_metadata().get("packed_shape")


# Rows from which a bf16 packed product goes to XLA's bf16 dot on CPUs with bf16 dot instructions:
# below, the kernel's fp32 FMAs win (the unpacking copy and the dot's start cost more than the rows
# save); XLA's was 0.7x the kernel at 64 rows, 1.1-1.2x at 128 and 1.7-1.9x at 256 (Qwen3-0.6B
# projections, one each, AMX host).
BF16_DOT_ROWS = 128
# The same for the AMX kernel (cpu_decode.amx()): 0.36-0.59x the fp32 kernel at 8 rows, 0.68-0.77x at
# 16, 0.87-1.12x at 32, 1.48-1.75x at 64 (the same four projections, bench: docs/benchmarks.md).
AMX_ROWS = 64
# The same for the AVX-512 BF16 kernel (cpu_decode.avx512_bf16(), without AMX), each weight read from
# memory as a model's layers read theirs: 0.49-0.71x the fp32 kernel at 8 rows (it rewrites the
# panel before multiplying; the fp32 kernel streams the weight at memory speed), 0.99-1.15x at 16,
# 1.18-1.34x at 24, 1.17-1.36x at 32 (Qwen3-0.6B's four projection shapes, AMD EPYC Zen 4:
# bench/bf16_products.py, docs/benchmarks.md).
AVX512_BF16_ROWS = 16


def dense(x: jax.Array, w: nnx.Variable) -> jax.Array:
    """x: [..., prod(w.shape[:dense_in])] -> [..., *w.shape[dense_in:]] in x's dtype.

    A 2D view of the weight: XLA's CPU dot is several times faster on [D, N*H] than on a dot with
    two output dimensions. A packed weight goes through the CPU kernel (fp32 activations inside), or,
    for a bf16 weight and many rows on a CPU with bf16 dots, the AMX kernel (`AMX_ROWS`), the AVX-512
    BF16 one (`AVX512_BF16_ROWS`) or XLA's bf16 dot (`BF16_DOT_ROWS`)."""
    value = w[...]
    n_in = dense_in(w)
    shape = packed_shape(w) or value.shape
    k, out = math.prod(shape[:n_in]), shape[n_in:]
    n = math.prod(out)
    if packed_shape(w) is None:
        # As a 2D product: with the batch and length axes left apart, the gradient's weight product
        # contracts two axes, and XLA:CPU lays the activation's gradient out transposed for it, a copy
        # that cost a third of the small shape's train step.
        return (x.reshape(-1, k) @ value.reshape(k, n).astype(x.dtype)).reshape(*x.shape[:-1], *out)
    rows = math.prod(x.shape[:-1])
    route = _bf16_route(rows) if value.dtype == jnp.bfloat16 else None
    if route is not None:
        # A prefill's many rows on a CPU with bf16 dot instructions, activations rounded to bf16 as a
        # bf16 model computes: our AMX or AVX-512 BF16 kernel on the packed panels; else (an AVX2
        # build) XLA's bf16 product on the weight unpacked for the call, the copy made once the input
        # is there (so that one layer's copy at a time is held).
        x2 = x.reshape(rows, k).astype(jnp.bfloat16)
        if route == "amx":
            y = cpu_decode.matmul_packed_amx(x2, value, n)
        elif route == "avx512_bf16":
            y = cpu_decode.matmul_packed_bf16dot(x2, value, n)
        else:
            y = jnp.dot(x2, cpu_decode.unpack(value, k, n, after=x2), preferred_element_type=jnp.float32)
    else:
        y = cpu_decode.matmul_packed(x.reshape(rows, k).astype(jnp.float32), value, n)
    return y.astype(x.dtype).reshape(*x.shape[:-1], *out)


def _bf16_route(rows: int) -> str | None:
    """Which bf16 product takes `rows` rows of a packed bf16 weight: "amx", "avx512_bf16", "xla" (its
    dot on the weight unpacked), or None (the fp32 kernel: no bf16 dots here, or too few rows)."""
    if not cpu_decode.bf16_dots():
        return None
    if cpu_decode.amx():
        return "amx" if rows >= AMX_ROWS else None
    if cpu_decode.avx512_bf16():
        return "avx512_bf16" if rows >= AVX512_BF16_ROWS else None
    return "xla" if rows >= BF16_DOT_ROWS else None


def logits(h: jax.Array, w: nnx.Variable, vocab_major: bool) -> jax.Array:
    """h: [B, T, D] -> fp32 logits [B, T, V] through the output projection `w`: the [D, V] lm_head, or
    the tied [V, D] embedding (vocab_major). The kernels take it when `pack_state` prepared it."""
    x = h.reshape(-1, h.shape[-1]).astype(jnp.float32)
    if (shape := packed_shape(w)) is not None:
        out = cpu_decode.matmul_packed(x, w[...], shape[-1]).reshape(*h.shape[:-1], -1)
    elif w.get_metadata().get("kernel_rows"):
        out = cpu_decode.matmul_nt(x, w[...]).reshape(*h.shape[:-1], -1)
    else:
        return project(h, w[...], vocab_major)
    return shd.constrain(out, (shd.ACT_BATCH, shd.ACT_LENGTH, shd.ACT_VOCAB))


def project(h: jax.Array, w: jax.Array, vocab_major: bool) -> jax.Array:
    """h: [B, T, D], w: [V, D] (vocab_major, a tied embedding) or [D, V] -> logits [B, T, V] fp32, by XLA.

    The tied embedding is contracted in its own layout: transposing a 151k x D matrix every decode
    step would cost more than the projection itself."""
    eq = "ND,VD->NV" if vocab_major else "ND,DV->NV"  # 2D for the reason `dense` gives.
    out = jnp.einsum(eq, h.reshape(-1, h.shape[-1]), w.astype(h.dtype), preferred_element_type=jnp.float32)
    return shd.constrain(out.reshape(*h.shape[:-1], -1), (shd.ACT_BATCH, shd.ACT_LENGTH, shd.ACT_VOCAB))


def embed_lookup(embed: nnx.Variable, tokens: jax.Array, dtype) -> jax.Array:
    """embed: the [V, D] table; tokens [B, T] -> rows [B, T, D] in `dtype`.

    A 16-bit table is gathered as raw bits: XLA:CPU gathers bf16 by converting the whole table to
    fp32 first, and hoists that copy out of the decode loop (0.62 GB held for the Qwen3-0.6B shape).
    The bit-cast is itself a table-sized copy there (0.31 GB), so a table `pack_state` marked
    `kernel_rows` is read row by row by the kernel instead."""
    if embed.get_metadata().get("kernel_rows"):
        rows = cpu_decode.take_rows(embed[...], tokens.reshape(-1)).reshape(*tokens.shape, -1)
        return rows.astype(dtype)
    table = embed[...]
    if table.dtype == jnp.float32:
        return jnp.take(table, tokens, axis=0).astype(dtype)
    return _take_bits(table, tokens).astype(dtype)


@jax.custom_vjp
def _take_bits(table: jax.Array, tokens: jax.Array) -> jax.Array:
    rows = jnp.take(jax.lax.bitcast_convert_type(table, _bits_dtype(table)), tokens, axis=0)
    return jax.lax.bitcast_convert_type(rows, table.dtype)


def _take_bits_fwd(table, tokens):
    return _take_bits(table, tokens), (table, tokens)


def _take_bits_bwd(res, g):
    table, tokens = res  # The gradient of a gather, as jnp.take's would be.
    return jnp.zeros(table.shape, g.dtype).at[tokens].add(g).astype(table.dtype), None


_take_bits.defvjp(_take_bits_fwd, _take_bits_bwd)


# Query rows per block of causal self-attention: a block reads keys up to its own end only, so the
# masked-out upper triangle is neither scored nor exponentiated (about half the work at long lengths).
CAUSAL_BLOCK = 128
_CAUSAL_BLOCKS: contextvars.ContextVar[bool] = contextvars.ContextVar("hljax_causal_blocks", default=True)


@contextlib.contextmanager
def whole_causal_attention() -> Iterator[None]:
    """Causal attention traced inside runs as one block. The shared-prefix pass needs it: there the
    blocked form's gradient crashed jaxlib 0.10.2's YNNPACK dot (SIGSEGV in ynn::dot_fp32_*, a 5 x
    1,200-token prefix on the tiny shape; fine with `--xla_cpu_experimental_ynn_fusion_type=`)."""
    token = _CAUSAL_BLOCKS.set(False)
    try:
        yield
    finally:
        _CAUSAL_BLOCKS.reset(token)


def attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float, dtype,
              filled: jax.Array | None = None, causal: bool = False, kernel: bool = False) -> jax.Array:
    """Grouped-query attention. q: [B, T, N, H]; k, v: [B, K, S, H] (a cache: in its stored dtype);
    mask: [B, T, S] bool -> [B, T, N, H] in `dtype`.

    filled: with a cache, the slots written so far (the kernel reads no slot past it); one decode
    token inside `use_kernels()` then goes through the kernel.
    causal: T == S and mask[:, t, s] is False for every s > t (self-attention over the fresh keys):
    query blocks skip the keys past their end.
    kernel: more than one query token goes through hljax/kernels/cpu_attention.py (fp32 q, k, v; it
    skips fully masked tiles itself, and gives 0 where a query keeps no key, which only padding does)."""
    B, T, N, H = q.shape
    if kernel and T > 1:
        return cpu_attention.attention(q, k.astype(jnp.float32), v.astype(jnp.float32), mask, scale).astype(dtype)
    K = k.shape[1]
    if (filled is not None and T == 1 and _ATTENTION.get() and k.dtype in cpu_decode.WEIGHT_DTYPES
            and k.dtype == v.dtype):
        # The kernel reads the cache in its stored dtype: a cast would convert every slot each step.
        out = cpu_decode.decode_attention(q.reshape(B, K, N // K, H).astype(jnp.float32), k, v, mask[:, 0],
                                          filled, scale)
        return out.reshape(B, T, N, H).astype(dtype)
    k, v = k.astype(dtype), v.astype(dtype)
    q = q.reshape(B, T, K, N // K, H).transpose(0, 2, 3, 1, 4)  # [B, K, G, T, H]
    if causal and T == k.shape[2] and T > CAUSAL_BLOCK and _CAUSAL_BLOCKS.get():
        blocks = [(a, min(T, a + CAUSAL_BLOCK)) for a in range(0, T, CAUSAL_BLOCK)]
        out = jnp.concatenate([_attend(q[:, :, :, a:e], k[:, :, :e], v[:, :, :e], mask[:, a:e, :e], scale)
                               for a, e in blocks], axis=3)
    else:
        out = _attend(q, k, v, mask, scale)
    return out.transpose(0, 3, 1, 2, 4).reshape(B, T, N, H)


def prefill_kernel(q: jax.Array, mask: jax.Array, cache: jax.Array) -> bool:
    """Whether `prefill_attention` takes this self-attention inside `use_kernels()`: T > 1 fresh
    tokens attending to themselves (mask [B, T, T]) written to a cache [B, K, T, H] of exactly those
    T slots (a prefill's), fp32 queries of a head size the kernel takes, a cache the kernels write."""
    T = q.shape[1]
    return (_ATTENTION.get() and T > 1 and mask.shape[-1] == T and cache.shape[2] == T
            and cache.dtype in cpu_decode.WEIGHT_DTYPES and cpu_attention.why_not(q.dtype, q.shape[-1]) is None)


def prefill_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float,
                      cache_dtype) -> tuple[jax.Array, jax.Array, jax.Array]:
    """q: [B, T, N, H]; k, v: [B, T, K, H] as projected; mask [B, T, T] -> (out [B, T, N, H] in q's
    dtype, k and v cache [B, K, T, H] in `cache_dtype`), by the CPU kernel (`prefill_kernel`).

    XLA transposes q, k (twice: once for the cache, once for its score dot), v and the output around
    its attention dots; in a bf16 Qwen3-0.6B prefill of 8 x 64 tokens those copies and the dots took
    ~0.35 s of 1.45 s (docs/benchmarks.md)."""
    out, k_cache, v_cache = cpu_attention.prefill(q, k, v, mask, scale, cache_dtype)
    return out.astype(q.dtype), k_cache, v_cache


def _attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float) -> jax.Array:
    """q: [B, K, G, T, H]; k, v: [B, K, S, H]; mask: [B, T, S] -> [B, K, G, T, H]."""
    scores = jnp.einsum("BKGTH,BKSH->BKGTS", q, k, preferred_element_type=jnp.float32) * scale
    scores = jnp.where(mask[:, None, None], scores, MASKED)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return jnp.einsum("BKGTS,BKSH->BKGTH", probs, v)


def write_slots(cache: jax.Array, x: jax.Array, slots: jax.Array) -> jax.Array:
    """cache [B, K, S, H] with x [B, K, H] written at slot slots[b] of row b (the engine's continuous
    batch, whose rows sit at different steps); in place through the kernel inside `use_kernels()`."""
    if _ATTENTION.get() and cache.dtype in cpu_decode.WEIGHT_DTYPES:
        return cpu_decode.kv_write(cache, x.astype(cache.dtype), slots)
    rows = jnp.arange(cache.shape[0])
    return scatter_bits(cache, (rows, slice(None), slots), x.astype(cache.dtype))


def copy_slots(dst: jax.Array, src: jax.Array, src_rows: jax.Array, dst_rows: jax.Array) -> jax.Array:
    """dst [B, K, S, H] with src [U, K, W, H]'s row src_rows[r] in slots [0, W) of row dst_rows[r] (a
    dst row out of range is skipped: padding); in place through the kernel inside `use_kernels()`."""
    if _ATTENTION.get() and dst.dtype in cpu_decode.WEIGHT_DTYPES and src.dtype == dst.dtype:
        return cpu_decode.copy_rows(dst, src, src_rows, dst_rows)
    # XLA gathers the R source rows of every layer into one temporary before scattering them (7.5 GB
    # for a 4 x 8 rollout of 1,000-token prompts, fp32 0.6B shape, on a CPU without the kernels). A
    # row-at-a-time loop avoided that on one device but all-gathers on a batch-sharded mesh; not
    # measured on accelerators, so the scatter stays.
    W = src.shape[2]
    return scatter_bits(dst, (dst_rows, slice(None), slice(None, W)), src[src_rows].astype(dst.dtype), mode="drop")


def scatter_bits(a: jax.Array, index, values: jax.Array, mode: str | None = None) -> jax.Array:
    """a.at[index].set(values, mode=mode), scattered as same-width integers: XLA:CPU scatters a bf16
    array by converting all of it to fp32 and back (every decode step, the whole cache of every layer)."""
    if a.dtype == jnp.float32:
        return a.at[index].set(values, mode=mode)
    bits = _bits_dtype(a)
    out = jax.lax.bitcast_convert_type(a, bits).at[index].set(jax.lax.bitcast_convert_type(values, bits), mode=mode)
    return jax.lax.bitcast_convert_type(out, a.dtype)


def _bits_dtype(a: jax.Array):
    """The unsigned integer type as wide as `a`'s elements (XLA moves those as raw bits, unconverted)."""
    return jnp.dtype(f"uint{8 * a.dtype.itemsize}")


@contextlib.contextmanager
def use_kernels() -> Iterator[None]:
    """Inside a trace: send one-token attention, a prefill's self-attention and cache write, per-row
    KV-cache writes and prefilled-row copies to the CPU kernels (projections and the embedding lookup
    follow their weights)."""
    token = _ATTENTION.set(True)
    try:
        yield
    finally:
        _ATTENTION.reset(token)


def kernel_weights(state: nnx.State) -> bool:
    """Whether a state's projection weights can go to the CPU kernels (fp32 or bf16)."""
    return any(dense_in(v) is not None and v[...].dtype in cpu_decode.WEIGHT_DTYPES
               for _, v in nnx.to_flat_state(state))


def pack_state(state: nnx.State, embedding: str) -> nnx.State:
    """`state` with every fp32/bf16 projection weight replaced by its packed panels (`cpu_decode.pack`,
    `packed_shape` set) and `embedding`, the path of the [V, D] token embedding, marked `kernel_rows`
    (looked up, and used as the output projection when tied, by the kernels). The state's other arrays
    are shared, not copied.

    Packed weights drop their sharding names: the kernels run on one CPU device."""
    flat = []
    for path, var in nnx.to_flat_state(state):
        key, value = _key(path), var[...]
        if key == embedding and value.dtype in cpu_decode.WEIGHT_DTYPES:
            var = var.replace(value=value, kernel_rows=True)
        elif (n_in := dense_in(var)) is not None and value.dtype in cpu_decode.WEIGHT_DTYPES:
            packed = _pack(value.reshape(math.prod(value.shape[:n_in]), -1))
            meta = {k: None for k in ("sharding_names", "out_sharding") if k in var.get_metadata()}
            var = var.replace(value=packed, packed_shape=tuple(value.shape), **meta)
        flat.append((path, var))
    return nnx.from_flat_state(flat)


@jax.jit
def _pack(w: jax.Array) -> jax.Array:
    return cpu_decode.pack(w)


def _key(path) -> str:
    return ".".join(str(p) for p in path)
