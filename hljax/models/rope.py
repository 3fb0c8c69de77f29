"""Rotary position embeddings: inverse frequencies per HF `rope_type`, and their application."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from hljax.models.config import RopeConfig


def inv_frequencies(rope: RopeConfig, head_dim: int) -> tuple[np.ndarray, float]:
    """-> (inv_freq [head_dim // 2] float32, attention scaling applied to cos and sin)."""
    exponents = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    pos_freqs = np.float32(rope.theta) ** exponents
    inv_freq = (1.0 / pos_freqs).astype(np.float32)
    scaling = 1.0
    if rope.type == "linear":
        inv_freq = inv_freq / np.float32(rope.factor)
    elif rope.type == "llama3":
        inv_freq = _llama3(inv_freq, rope)
    elif rope.type == "yarn":
        inv_freq, scaling = _yarn(pos_freqs, head_dim, rope)
    return inv_freq.astype(np.float32), float(scaling)


def _llama3(inv_freq: np.ndarray, rope: RopeConfig) -> np.ndarray:
    old_len = rope.original_max_position_embeddings
    low_wavelen = old_len / rope.low_freq_factor
    high_wavelen = old_len / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_len / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, scaled)


def _yarn(pos_freqs: np.ndarray, dim: int, rope: RopeConfig) -> tuple[np.ndarray, float]:
    """YaRN (Peng et al. 2023): interpolate low frequencies, keep high ones, rescale attention."""
    factor, base = rope.factor, rope.theta

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    scaling = rope.attention_factor
    if scaling is None:
        if rope.mscale and rope.mscale_all_dim:
            scaling = mscale(factor, rope.mscale) / mscale(factor, rope.mscale_all_dim)
        else:
            scaling = mscale(factor)

    def correction_dim(rotations):
        return dim * math.log(rope.original_max_position_embeddings / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # Avoid a zero-width ramp.
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq.astype(np.float32), scaling


def cos_sin(positions: jax.Array, inv_freq: np.ndarray, scaling: float, dtype) -> tuple[jax.Array, jax.Array]:
    """positions: [B, T] int -> cos, sin: [B, T, head_dim] in `dtype`."""
    freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)  # [B, T, H/2]
    # cos and sin before the concatenation: after it, XLA:CPU fuses them into every layer's rotation
    # and evaluates them once per head there (1.7 ms instead of 0.5 for a [8, 64, 16, 128] query).
    c, s = jnp.cos(freqs) * scaling, jnp.sin(freqs) * scaling
    return jnp.concatenate([c, c], axis=-1).astype(dtype), jnp.concatenate([s, s], axis=-1).astype(dtype)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x: [B, T, N, H]; cos, sin: [B, T, H]. Rotate-half convention (HF Qwen/Llama)."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, :, None, :] + rotated * sin[:, :, None, :]
