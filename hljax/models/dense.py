"""Projections through weight matrices, and the switch to the CPU decode kernels.

Every projection weight is an `nnx.Param` with a `dense_in` metadata field: its first `dense_in`
dimensions are contracted (q_proj [D, N, H] has 1, o_proj [N, H, D] has 2). `dense` multiplies
through the weight viewed as a 2D matrix.

On a CPU the generation engine replaces these weights by their packed form (`pack_state`): one
layout, not a second copy. A packed weight carries `packed_shape` (its natural shape) in its
metadata, and `dense` sends every product through it to `hljax.kernels.cpu_decode` (decode steps and
prefill alike; the kernel is a GEMM over contiguous column panels). The token embedding stays [V, D]
and is marked `kernel_rows`: the kernels look tokens up in it and, when it is tied, `kernel_logits`
reads it row by row as the output projection. The engine traces its decode steps inside
`use_kernels()`, which also sends one-token attention to the kernel.
The training path never packs, and accelerators run everything through XLA.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from typing import Iterator

import jax
import jax.numpy as jnp
from flax import nnx

from hljax.kernels import cpu_decode

_ATTENTION: contextvars.ContextVar[bool] = contextvars.ContextVar("hljax_kernel_attention", default=False)


def dense_in(w: nnx.Variable) -> int | None:
    """How many leading dims of `w` a projection contracts, or None if `w` is not a projection weight."""
    return w.get_metadata().get("dense_in")


def packed_shape(w: nnx.Variable) -> tuple[int, ...] | None:
    """The natural shape of a weight `pack_state` packed, else None."""
    return w.get_metadata().get("packed_shape")


def dense(x: jax.Array, w: nnx.Variable) -> jax.Array:
    """x: [..., prod(w.shape[:dense_in])] -> [..., *w.shape[dense_in:]] in x's dtype.

    A 2D view of the weight: XLA's CPU dot is several times faster on [D, N*H] than on a dot with
    two output dimensions. A packed weight goes through the CPU kernel (fp32 activations inside)."""
    value = w[...]
    n_in = dense_in(w)
    shape = packed_shape(w) or value.shape
    k, out = math.prod(shape[:n_in]), shape[n_in:]
    n = math.prod(out)
    if packed_shape(w) is None:
        return (x @ value.reshape(k, n).astype(x.dtype)).reshape(*x.shape[:-1], *out)
    y = cpu_decode.matmul_packed(x.reshape(-1, k).astype(jnp.float32), value, n)
    return y.astype(x.dtype).reshape(*x.shape[:-1], *out)


def kernel_logits(h: jax.Array, w: nnx.Variable) -> jax.Array | None:
    """h: [B, T, D] -> fp32 logits [B, T, V] through the kernels when `w` was prepared for them, else None.

    w: the output projection, the [D, V] lm_head (packed) or the tied [V, D] embedding (`kernel_rows`)."""
    x = h.reshape(-1, h.shape[-1]).astype(jnp.float32)
    if (shape := packed_shape(w)) is not None:
        out = cpu_decode.matmul_packed(x, w[...], shape[-1])
    elif w.get_metadata().get("kernel_rows"):
        out = cpu_decode.matmul_nt(x, w[...])
    else:
        return None
    return out.reshape(*h.shape[:-1], -1)


def kernel_take(table: nnx.Variable, tokens: jax.Array) -> jax.Array | None:
    """table[tokens] -> fp32 [*tokens.shape, D] through the CPU kernel for a table `pack_state` marked
    `kernel_rows`, else None."""
    if not table.get_metadata().get("kernel_rows"):
        return None
    return cpu_decode.take_rows(table[...], tokens.reshape(-1)).reshape(*tokens.shape, -1)


def kernel_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float,
                     filled: jax.Array) -> jax.Array | None:
    """One decode token through the attention kernel inside `use_kernels()`, else None.

    q: [B, 1, N, H]; k, v: [B, K, S, H] (the whole cache, fp32 or bf16); mask: [B, 1, S]; filled: the
    cache slots written so far (slots past it are not read) -> [B, 1, N * H] in q's dtype."""
    B, T, N, H = q.shape
    if T != 1 or not _ATTENTION.get() or k.dtype not in cpu_decode.WEIGHT_DTYPES or k.dtype != v.dtype:
        return None
    K = k.shape[1]
    out = cpu_decode.decode_attention(q.reshape(B, K, N // K, H).astype(jnp.float32), k, v, mask[:, 0], filled,
                                      scale)
    return out.reshape(B, 1, N * H).astype(q.dtype)


def kernel_kv_write(cache: jax.Array, x: jax.Array, slots: jax.Array) -> jax.Array | None:
    """cache [B, K, S, H] with x [B, K, H] written at slots [B], in place, inside `use_kernels()`; else None."""
    if not _ATTENTION.get() or cache.dtype not in cpu_decode.WEIGHT_DTYPES:
        return None
    return cpu_decode.kv_write(cache, x.astype(cache.dtype), slots)


def kernel_copy_rows(dst: jax.Array, src: jax.Array, src_rows: jax.Array, dst_rows: jax.Array) -> jax.Array | None:
    """dst [B, K, S, H] with src [U, K, W, H]'s row src_rows[r] in slots [0, W) of row dst_rows[r], in
    place, inside `use_kernels()`; else None."""
    if not _ATTENTION.get() or dst.dtype not in cpu_decode.WEIGHT_DTYPES or src.dtype != dst.dtype:
        return None
    return cpu_decode.copy_rows(dst, src, src_rows, dst_rows)


@contextlib.contextmanager
def use_kernels() -> Iterator[None]:
    """Inside a trace: send one-token attention, per-row KV-cache writes and prefilled-row copies to
    the CPU kernels (projections and the embedding lookup follow their weights)."""
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
