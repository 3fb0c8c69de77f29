"""Projections through weight matrices, and the switch to the CPU decode kernels.

Every projection weight is an `nnx.Param` with a `dense_in` metadata field: its first `dense_in`
dimensions are contracted (q_proj [D, N, H] has 1, o_proj [N, H, D] has 2). `dense` multiplies
through the weight viewed as a 2D matrix.

The generation engine may pack these matrices for `hljax.kernels.cpu_decode` and trace its decode
step inside `use_packed(...)`; `dense` then sends a few-row product (a decode step's batch) to the
kernel instead of XLA's dot. Nothing else changes: the training path never packs, and every product
with more rows (the prefill) stays with XLA.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
from typing import Iterator

import jax
import jax.numpy as jnp
from flax import nnx

from hljax.kernels import cpu_decode

# Rows (batch x new tokens) up to which the kernels beat XLA's dot; the engine's decode batches.
KERNEL_MAX_ROWS = 16

_PACKED: contextvars.ContextVar[dict[int, jax.Array] | None] = contextvars.ContextVar("hljax_packed", default=None)


def dense_in(w: nnx.Variable) -> int | None:
    """How many leading dims of `w` a projection contracts, or None if `w` is not a projection weight."""
    return w.get_metadata().get("dense_in")


def dense(x: jax.Array, w: nnx.Variable) -> jax.Array:
    """x: [..., prod(w.shape[:dense_in])] -> [..., *w.shape[dense_in:]] in x's dtype.

    A 2D view of the weight: XLA's CPU dot is several times faster on [D, N*H] than on a dot with
    two output dimensions."""
    value = w[...]
    n_in = dense_in(w)
    k, out = math.prod(value.shape[:n_in]), value.shape[n_in:]
    n = math.prod(out)
    packed = _kernel_weight(w, x)
    if packed is None:
        return (x @ value.reshape(k, n).astype(x.dtype)).reshape(*x.shape[:-1], *out)
    return cpu_decode.matmul_packed(x.reshape(-1, k), packed, n).reshape(*x.shape[:-1], *out)


def kernel_logits(h: jax.Array, w: nnx.Variable) -> jax.Array | None:
    """h: [B, T, D] -> fp32 logits [B, T, V] through the kernels inside a packed trace, else None.

    w: the output projection, the [D, V] lm_head or the tied [V, D] embedding (packed transposed)."""
    if (packed := _kernel_weight(w, h)) is None:
        return None
    return cpu_decode.matmul_packed(h.reshape(-1, h.shape[-1]), packed, packed_n(w)).reshape(*h.shape[:-1], -1)


def packed_n(w: nnx.Variable) -> int:
    """Output width of a projection or output-embedding weight."""
    n_in = dense_in(w)
    return w[...].shape[0] if n_in is None else math.prod(w[...].shape[n_in:])


def kernel_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float) -> jax.Array | None:
    """One decode token through the attention kernel inside a packed trace, else None.

    q: [B, 1, N, H]; k, v: [B, K, S, H] (the whole cache); mask: [B, 1, S] -> [B, 1, N * H]."""
    B, T, N, H = q.shape
    if T != 1 or not use_kernel(q[:, :, 0]) or k.dtype != jnp.float32 or v.dtype != jnp.float32:
        return None
    K = k.shape[1]
    out = cpu_decode.decode_attention(q.reshape(B, K, N // K, H), k, v, mask[:, 0], scale)
    return out.reshape(B, 1, N * H)


def use_kernel(x: jax.Array) -> bool:
    """Whether a product with x's rows goes to the CPU kernels in the current trace."""
    rows = math.prod(x.shape[:-1])
    return _PACKED.get() is not None and rows <= KERNEL_MAX_ROWS and x.dtype == jnp.float32


def _kernel_weight(w: nnx.Variable, x: jax.Array) -> jax.Array | None:
    if not use_kernel(x):
        return None
    return _PACKED.get().get(id(w))


@contextlib.contextmanager
def use_packed(model: nnx.Module, packed: dict[str, jax.Array]) -> Iterator[None]:
    """Inside a trace: send few-row products through `model`'s packed weights (`pack_state`).

    `model` is the module being traced (merged inside the jitted function) and `packed` the packed
    arrays passed to that function, keyed by dotted parameter path."""
    by_id = {id(var): packed[_key(path)] for path, var in nnx.iter_graph(model)
             if isinstance(var, nnx.Variable) and _key(path) in packed}
    token = _PACKED.set(by_id)
    try:
        yield
    finally:
        _PACKED.reset(token)


def pack_state(state: nnx.State, tied_embedding: str | None) -> dict[str, jax.Array]:
    """Every fp32 projection weight of a model's state packed for the CPU kernels, by dotted path;
    `tied_embedding`, the path of a [V, D] embedding that is also the output projection, is packed
    as its transpose.

    A second copy of those weights: the prefill keeps using the originals through XLA."""
    mats, transposed = {}, set()
    for path, var in nnx.to_flat_state(state):
        key, value = _key(path), var[...]
        if value.dtype != jnp.float32:
            continue
        if key == tied_embedding:
            mats[key] = value
            transposed.add(key)
        elif (n_in := dense_in(var)) is not None:
            mats[key] = value.reshape(math.prod(value.shape[:n_in]), -1)
    return _pack_all(mats, frozenset(transposed))


@functools.partial(jax.jit, static_argnums=1)
def _pack_all(mats: dict[str, jax.Array], transposed: frozenset[str]) -> dict[str, jax.Array]:
    return {k: cpu_decode.pack(w.T if k in transposed else w) for k, w in mats.items()}


def _key(path) -> str:
    return ".".join(str(p) for p in path)
