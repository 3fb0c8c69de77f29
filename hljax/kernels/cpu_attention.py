"""Masked grouped-query attention on CPUs with its own gradient (`cpu_attention.cc`): scores, mask,
softmax and both products in one call per direction, tile by tile, instead of XLA's separate
programs over [rows, keys] tensors. fp32 only; built and registered with the decode kernels
(`cpu_decode.availability()`). A model uses it when its `ModelConfig.attention_kernel` is set
(a run's `model.attention_kernel`, `resolve`); the generation engine's prefill uses `prefill`."""

from __future__ import annotations

import functools
import logging

import jax
import jax.numpy as jnp
import numpy as np

from hljax.kernels import cpu_decode

log = logging.getLogger(__name__)


def why_not(dtype, head_dim: int) -> str | None:
    """None when the kernel runs here for this compute dtype and head size, else why not (the call
    also registers the kernels with XLA)."""
    reason = cpu_decode.availability()
    if reason is not None:
        return reason
    lanes = 16 if cpu_decode.isa() == "avx512" else 8
    if jnp.dtype(dtype) != jnp.float32:
        return f"the compute dtype is {jnp.dtype(dtype).name}, and the kernel is fp32 only"
    if head_dim % lanes:
        return f"head_dim {head_dim} is not a multiple of the kernel's {lanes} lanes"
    return None


def resolve(mode: str, dtype, head_dim: int, devices: int) -> bool:
    """A run's `model.attention_kernel` ("off", "auto", "on") -> whether its model uses the kernel:
    "auto" when it can run (else XLA, logged), "on" raises KernelUnavailable when it cannot."""
    if mode == "off":
        return False
    reason = why_not(dtype, head_dim)
    if reason is None and devices != 1:
        reason = f"the mesh has {devices} devices, and the kernel call is not partitioned (issue 39)"
    if reason is not None and mode == "on":
        raise cpu_decode.KernelUnavailable(f"model.attention_kernel='on' but {reason}")
    log.info("attention: %s", "hljax CPU kernel" if reason is None else f"XLA ({reason})")
    return reason is None


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float) -> jax.Array:
    """q: [B, T, N, H]; k, v: [B, K, S, H] (K divides N); mask: [B, T, S] bool -> [B, T, N, H], fp32.

    softmax(scale q.k over the keys the mask keeps) . v; a query with no kept key gives 0 (XLA's
    path gives the mean of v there: such rows are padding, which nothing reads)."""
    return _forward(q, k, v, mask, scale)[0]


def _forward(q, k, v, mask, scale):
    reason = why_not(q.dtype, q.shape[-1]) or (None if k.dtype == v.dtype == jnp.float32 else "k, v are not fp32")
    if reason is not None:
        raise cpu_decode.KernelUnavailable(reason)
    B, T, N, _ = q.shape
    out = (jax.ShapeDtypeStruct(q.shape, jnp.float32), jax.ShapeDtypeStruct((B, T, N), jnp.float32))
    return jax.ffi.ffi_call("hljax_attention_forward", out)(q, k, v, mask, scale=np.float32(scale))


def _fwd(q, k, v, mask, scale):
    o, lse = _forward(q, k, v, mask, scale)
    return o, (q, k, v, mask, o, lse)


def _bwd(scale, res, do):
    q, k, v, mask, o, lse = res
    out = (jax.ShapeDtypeStruct(q.shape, jnp.float32), jax.ShapeDtypeStruct(k.shape, jnp.float32),
           jax.ShapeDtypeStruct(v.shape, jnp.float32))
    dq, dk, dv = jax.ffi.ffi_call("hljax_attention_backward", out)(q, k, v, mask, o, lse, do.astype(jnp.float32),
                                                                    scale=np.float32(scale))
    return dq, dk, dv, None


attention.defvjp(_fwd, _bwd)


def prefill(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float,
            cache_dtype) -> tuple[jax.Array, jax.Array, jax.Array]:
    """A prefill's self-attention over its T fresh keys, and the KV cache of those T slots.

    q: [B, T, N, H]; k, v: [B, T, K, H] (as the projections leave them: no transposes); mask [B, T, T]
    bool -> (out [B, T, N, H] fp32, k and v cache [B, K, T, H] in `cache_dtype`, fp32 or bf16, rounded
    to nearest even). As `attention`, a query with no kept key gives 0. No gradient: generation only."""
    reason = why_not(q.dtype, q.shape[-1])
    if reason is not None:
        raise cpu_decode.KernelUnavailable(reason)
    B, T, K, H = k.shape
    cache = jax.ShapeDtypeStruct((B, K, T, H), cache_dtype)
    out = (jax.ShapeDtypeStruct(q.shape, jnp.float32), cache, cache)
    f32 = lambda x: x.astype(jnp.float32)  # noqa: E731
    return jax.ffi.ffi_call("hljax_prefill_attention", out)(f32(q), f32(k), f32(v), mask, scale=np.float32(scale))
