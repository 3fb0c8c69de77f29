"""Qwen3.5's text model (Qwen3.5-0.8B ... 27B dense) in Flax NNX: a hybrid of Gated DeltaNet linear
attention and gated full attention, per `cfg.layer_types` (every 4th layer full in the releases).

Differences from Qwen3 (all from transformers' `modeling_qwen3_5.py`, the reference):
- RMSNorms are zero-centred (`x_hat * (1 + w)`, weights stored as read); the Gated DeltaNet output
  norm is a plain `w * x_hat` gated by silu(z).
- Full attention: q_proj yields a query and an output gate per head ([D, N, 2H] here); the
  attention output is multiplied by sigmoid(gate) before o_proj. RoPE rotates only the first
  `rotary_dim` = head_dim * partial_rotary_factor channels.
- Linear attention layers keep a fixed-size state: the last W - 1 conv inputs and the [Dk, Dv]
  delta-rule state per value head (`LinearCache`), beside the KV cache of the full-attention layers.
- Left padding: like transformers, a linear-attention layer zeroes the hidden states of padding
  tokens before its projections, so padding contributes nothing to the conv or the state and a
  left-padded row computes exactly what the row alone would.

Shapes as in `qwen3`: B batch, T query length, S key length, D hidden, N query heads, K kv heads,
H head dim; C = 2 Hk Dk + Hv Dv conv channels, W conv width, Hk/Hv linear key/value heads, Dk/Dv their dims.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hljax import sharding as shd
from hljax.models import gated_deltanet as gdn
from hljax.models import ops
from hljax.models.config import ModelConfig
from hljax.models.ops import dense, embed_lookup
from hljax.models.qwen3 import (MLP, LayerCache, SharedPrefix, _normal, _ones, _param, _zeros, attend, decode_mask,
                                logits, remat_call)
from hljax.models.rope import apply_rope, cos_sin, inv_frequencies


@flax.struct.dataclass
class LinearCache:
    """Fixed-size state of one Gated DeltaNet layer, whatever the sequence length."""

    conv: jax.Array  # [B, W - 1, C] the last W - 1 conv inputs
    state: jax.Array  # [B, Hv, Dk, Dv] fp32 delta-rule state


def init_cache(cfg: ModelConfig, batch: int, max_len: int, dtype=None) -> list[LayerCache | LinearCache]:
    """Per layer: a KV cache of `max_len` slots for full attention, a `LinearCache` for linear attention."""
    dtype = dtype or cfg.dtype
    kv_shape = (batch, cfg.num_kv_heads, max_len, cfg.head_dim)
    out = []
    for kind in cfg.layer_types:
        if kind == "full_attention":
            out.append(LayerCache(jnp.zeros(kv_shape, dtype), jnp.zeros(kv_shape, dtype)))
        else:
            out.append(LinearCache(
                jnp.zeros((batch, cfg.linear_conv_kernel_dim - 1, _conv_dim(cfg)), dtype),
                jnp.zeros((batch, cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim),
                          jnp.float32),
            ))
    return out


def _conv_dim(cfg: ModelConfig) -> int:
    return 2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim + cfg.linear_num_value_heads * cfg.linear_value_head_dim


class RMSNorm(nnx.Module):
    """Zero-centred RMSNorm: x_hat * (1 + w), in fp32, then cast (transformers' Qwen3_5RMSNorm)."""

    def __init__(self, dim: int, eps: float, *, names: tuple[str | None, ...], param_dtype, rngs: nnx.Rngs):
        self.scale = _param(rngs, _zeros, (dim,), names, param_dtype)
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (y * (1.0 + self.scale[...].astype(jnp.float32))).astype(x.dtype)


class GatedRMSNorm(nnx.Module):
    """w * x_hat * silu(gate) over the value head dim (transformers' Qwen3_5RMSNormGated)."""

    def __init__(self, dim: int, eps: float, *, param_dtype, rngs: nnx.Rngs):
        self.scale = _param(rngs, _ones, (dim,), (shd.HEAD_DIM,), param_dtype)
        self.eps = eps

    def __call__(self, x: jax.Array, gate: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        y = (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)).astype(x.dtype)
        y = self.scale[...].astype(x.dtype) * y
        return (y.astype(jnp.float32) * jax.nn.silu(gate.astype(jnp.float32))).astype(x.dtype)


class GatedAttention(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        D, N, K, H, pd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.param_dtype
        # Query and output gate of each head side by side, as HF's q_proj rows are: [q_h | gate_h] per head.
        self.q_proj = _param(rngs, _normal, (D, N, 2 * H), (shd.EMBED, shd.HEADS, shd.HEAD_DIM), pd, dense_in=1)
        self.k_proj = _param(rngs, _normal, (D, K, H), (shd.EMBED, shd.KV_HEADS, shd.HEAD_DIM), pd, dense_in=1)
        self.v_proj = _param(rngs, _normal, (D, K, H), (shd.EMBED, shd.KV_HEADS, shd.HEAD_DIM), pd, dense_in=1)
        self.o_proj = _param(rngs, _normal, (N, H, D), (shd.HEADS, shd.HEAD_DIM, shd.EMBED), pd, dense_in=2)
        self.q_norm = RMSNorm(H, cfg.rms_norm_eps, names=(shd.HEAD_DIM,), param_dtype=pd, rngs=rngs)
        self.k_norm = RMSNorm(H, cfg.rms_norm_eps, names=(shd.HEAD_DIM,), param_dtype=pd, rngs=rngs)
        self.cfg = cfg

    def __call__(self, x, cos, sin, mask, cache: LayerCache | None, cache_index):
        """x: [B, T, D]; cos, sin: [B, T, rotary_dim]; mask: [B, T, S] bool -> ([B, T, D], cache)."""
        cfg = self.cfg
        B, T, _ = x.shape
        H, r = cfg.head_dim, cfg.rotary_dim
        act_heads = (shd.ACT_BATCH, shd.ACT_LENGTH, shd.ACT_HEADS, shd.ACT_HEAD_DIM)
        qg = dense(x, self.q_proj)  # [B, T, N, 2H]
        q, gate = self.q_norm(qg[..., :H]), qg[..., H:]
        k = self.k_norm(dense(x, self.k_proj))
        v = dense(x, self.v_proj)
        rotate = lambda t: jnp.concatenate([apply_rope(t[..., :r], cos, sin), t[..., r:]], axis=-1)  # noqa: E731
        q = shd.constrain(rotate(q), act_heads)
        out, cache = attend(q, rotate(k), v, mask, cache, cache_index, H**-0.5, x.dtype, self.cfg.attention_kernel)
        out = out * jax.nn.sigmoid(gate)
        y = dense(out.reshape(B, T, -1), self.o_proj)
        return y, cache


class GatedDeltaNet(nnx.Module):
    """Linear attention: projections, causal conv, gated delta rule, gated norm, output projection."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        D, pd = cfg.hidden_size, cfg.param_dtype
        Hv, Dv, W = cfg.linear_num_value_heads, cfg.linear_value_head_dim, cfg.linear_conv_kernel_dim
        C = _conv_dim(cfg)
        # q, k and v share one projection and one conv over their concatenated channels (HF's layout);
        # those channels are not head-major, so they stay unsharded over `tensor`.
        self.in_proj_qkv = _param(rngs, _normal, (D, C), (shd.EMBED, None), pd, dense_in=1)
        self.in_proj_z = _param(rngs, _normal, (D, Hv, Dv), (shd.EMBED, shd.HEADS, shd.HEAD_DIM), pd, dense_in=1)
        self.in_proj_b = _param(rngs, _normal, (D, Hv), (shd.EMBED, shd.HEADS), pd, dense_in=1)
        self.in_proj_a = _param(rngs, _normal, (D, Hv), (shd.EMBED, shd.HEADS), pd, dense_in=1)
        self.conv = _param(rngs, _normal, (W, C), (None, None), pd)
        self.dt_bias = _param(rngs, _ones, (Hv,), (shd.HEADS,), pd)
        # log A with A ~ U(1, 16): HF's init range (0.01, 16) trimmed so a random model decays visibly.
        self.A_log = nnx.Param(nnx.with_partitioning(
            lambda key, shape, dtype: jnp.log(jax.random.uniform(key, shape, dtype, 1.0, 16.0)), (shd.HEADS,)
        )(rngs.params(), (Hv,), pd))
        self.norm = GatedRMSNorm(Dv, cfg.rms_norm_eps, param_dtype=pd, rngs=rngs)
        self.out_proj = _param(rngs, _normal, (Hv, Dv, D), (shd.HEADS, shd.HEAD_DIM, shd.EMBED), pd, dense_in=2)
        self.cfg = cfg

    def __call__(self, x, valid, cache: LinearCache | None):
        """x: [B, T, D]; valid: [B, T] bool (False at padding) -> ([B, T, D], cache).

        With a cache and T == 1 (decode) the recurrent form runs; otherwise the chunked form, from the
        cached state when there is one."""
        cfg = self.cfg
        B, T, _ = x.shape
        Hk, Hv, Dk, Dv = cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim, \
            cfg.linear_value_head_dim
        x = x * valid[..., None].astype(x.dtype)  # Padding must not reach the conv or the state.
        qkv = dense(x, self.in_proj_qkv)  # [B, T, C]
        z = dense(x, self.in_proj_z)  # [B, T, Hv, Dv]
        b, a = dense(x, self.in_proj_b), dense(x, self.in_proj_a)  # [B, T, Hv]
        W = cfg.linear_conv_kernel_dim
        conv_state = cache.conv if cache is not None else jnp.zeros((B, W - 1, qkv.shape[-1]), x.dtype)
        qkv, conv_state = gdn.causal_conv(qkv, self.conv[...], conv_state)
        q = qkv[..., : Hk * Dk].reshape(B, T, Hk, Dk)
        k = qkv[..., Hk * Dk : 2 * Hk * Dk].reshape(B, T, Hk, Dk)
        v = qkv[..., 2 * Hk * Dk :].reshape(B, T, Hv, Dv)
        beta = jax.nn.sigmoid(b.astype(jnp.float32))
        # log decay g = -A softplus(a + dt_bias) <= 0, in fp32 (A = exp(A_log) overflows in fp16).
        g = -jnp.exp(self.A_log[...].astype(jnp.float32)) * jax.nn.softplus(
            a.astype(jnp.float32) + self.dt_bias[...].astype(jnp.float32))
        q, k = gdn.prepare_qk(q, k, Hv)
        state = cache.state if cache is not None else jnp.zeros((B, Hv, Dk, Dv), jnp.float32)
        if cache is not None and T == 1:
            o, state = gdn.recurrent(q, k, v, g, beta, state)
        else:
            o, state = gdn.chunked(q, k, v, g, beta, state, cfg.linear_chunk_size)
        o = shd.constrain(self.norm(o.astype(x.dtype), z), (shd.ACT_BATCH, shd.ACT_LENGTH, shd.ACT_HEADS, None))
        y = dense(o.reshape(B, T, -1), self.out_proj)
        return y, (LinearCache(conv_state.astype(cache.conv.dtype), state) if cache is not None else None)


class DecoderLayer(nnx.Module):
    def __init__(self, cfg: ModelConfig, kind: str, *, rngs: nnx.Rngs):
        pd = cfg.param_dtype
        self.kind = kind
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, names=(shd.NORM,), param_dtype=pd, rngs=rngs)
        if kind == "linear_attention":
            self.linear_attn = GatedDeltaNet(cfg, rngs=rngs)
        else:
            self.attn = GatedAttention(cfg, rngs=rngs)
        self.post_attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, names=(shd.NORM,), param_dtype=pd, rngs=rngs)
        self.mlp = MLP(cfg, rngs=rngs)

    def __call__(self, x, cos, sin, mask, valid, cache, cache_index):
        h = self.input_norm(x)
        if self.kind == "linear_attention":
            h, cache = self.linear_attn(h, valid, cache)
        else:
            h, cache = self.attn(h, cos, sin, mask, cache, cache_index)
        x = x + h
        x = x + self.mlp(self.post_attn_norm(x))
        return shd.constrain(x, (shd.ACT_BATCH, shd.ACT_LENGTH, shd.ACT_EMBED)), cache


class Qwen3_5(nnx.Module):
    """Causal LM with Qwen3's interface (`__call__`, `hidden_states`, `decode_step`, `logits`)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        if not cfg.is_hybrid:
            raise ValueError(f"Qwen3_5 needs a qwen3_5 config, got model_type={cfg.model_type!r}")
        self.cfg = cfg
        pd = cfg.param_dtype
        self.embed = _param(rngs, _normal, (cfg.vocab_size, cfg.hidden_size), (shd.VOCAB, shd.EMBED), pd)
        self.layers = nnx.List([DecoderLayer(cfg, kind, rngs=rngs) for kind in cfg.layer_types])
        self.final_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, names=(shd.NORM,), param_dtype=pd, rngs=rngs)
        if not cfg.tie_word_embeddings:
            self.lm_head = _param(rngs, _normal, (cfg.hidden_size, cfg.vocab_size), (shd.EMBED, shd.VOCAB), pd, dense_in=1)
        inv_freq, self.rope_scaling = inv_frequencies(cfg.rope, cfg.rotary_dim)
        self.inv_freq = tuple(inv_freq.tolist())  # Static: a hashable constant, not a parameter.

    def __call__(self, tokens: jax.Array, positions: jax.Array, attention_mask: jax.Array) -> jax.Array:
        """tokens, positions, attention_mask (1 = real token): [B, T] -> logits [B, T, V]."""
        return self.logits(self.hidden_states(tokens, positions, attention_mask))

    def hidden_states(self, tokens, positions, attention_mask) -> jax.Array:
        """-> final-norm hidden states [B, T, D]."""
        T = tokens.shape[1]
        valid = attention_mask.astype(bool)
        causal = jnp.arange(T)[None, :] <= jnp.arange(T)[:, None]  # [T, S]
        h, _ = self._decode(tokens, positions, causal[None] & valid[:, None, :], valid, None, 0)
        return h

    def shared_prefix_hidden_states(self, prefix_tokens, prefix_mask, tokens, attention_mask) -> jax.Array:
        """As `Qwen3.shared_prefix_hidden_states`; a linear-attention layer hands each row its prefix's
        final conv inputs and delta-rule state (the left padding left them as the real tokens made them)."""
        with ops.whole_causal_attention():
            return self._shared_prefix_hidden_states(prefix_tokens, prefix_mask, tokens, attention_mask)

    def _shared_prefix_hidden_states(self, prefix_tokens, prefix_mask, tokens, attention_mask) -> jax.Array:
        cfg = self.cfg
        geo = SharedPrefix(prefix_mask, attention_mask)
        (xp, cos_p, sin_p), (xs, cos_s, sin_s) = geo.embed(self, prefix_tokens, tokens)
        call = remat_call if cfg.remat else (lambda l, *a: l(*a))
        empty_linear = init_cache(cfg, prefix_tokens.shape[0], 1)
        for i, layer in enumerate(self.layers):
            if layer.kind == "linear_attention":
                xp, c = call(layer, xp, cos_p, sin_p, None, geo.prefix_valid, empty_linear[i], 0)
                xs, _ = call(layer, xs, cos_s, sin_s, None, geo.valid, LinearCache(geo.repeat(c.conv), geo.repeat(c.state)), 0)
            else:
                xp, kv = call(layer, xp, cos_p, sin_p, geo.prefix_attention, geo.prefix_valid, geo.empty_kv(cfg), 0)
                xs, _ = call(layer, xs, cos_s, sin_s, geo.attention, geo.valid, geo.shared_kv(kv), geo.Lp)
        return self.final_norm(xs)

    def decode_step(self, tokens, positions, kv_valid, cache, cache_index, *, prefill: bool = False):
        """As `Qwen3.decode_step`: T new tokens at cache slots [cache_index, cache_index + T).

        tokens, positions: [B, T]; kv_valid: [B, S] (False at padding slots); cache from `init_cache`;
        cache_index a scalar or [B] (as in Qwen3)
        -> (final-norm hidden states [B, T, D], cache). Linear-attention layers read kv_valid at the new
        tokens' slots to zero padding; their state replaces the old one (no slots)."""
        B, T, S = tokens.shape[0], tokens.shape[1], kv_valid.shape[1]
        mask = decode_mask(kv_valid, cache_index, T, T if prefill else S)
        at = jnp.broadcast_to(jnp.reshape(cache_index, (-1, 1)) + jnp.arange(T), (B, T))
        valid = jnp.take_along_axis(kv_valid.astype(bool), at, axis=1)
        return self._decode(tokens, positions, mask, valid, cache, cache_index)

    def _decode(self, tokens, positions, mask, valid, caches, cache_index):
        cfg = self.cfg
        x = embed_lookup(self.embed, tokens, cfg.dtype)
        x = shd.constrain(x, (shd.ACT_BATCH, shd.ACT_LENGTH, shd.ACT_EMBED))
        cos, sin = cos_sin(positions, np.asarray(self.inv_freq, np.float32), self.rope_scaling, cfg.dtype)
        call = remat_call if cfg.remat else (lambda l, *a: l(*a))
        new_caches = []
        for i, layer in enumerate(self.layers):
            cache = None if caches is None else caches[i]
            x, cache = call(layer, x, cos, sin, mask, valid, cache, cache_index)
            new_caches.append(cache)
        return self.final_norm(x), new_caches

    def head_weight(self) -> jax.Array:
        return self.embed[...] if self.cfg.tie_word_embeddings else self.lm_head[...]

    def logits(self, h: jax.Array) -> jax.Array:
        """h: [B, T, D] -> logits [B, T, V] in fp32."""
        return logits(self, h)


def create(cfg: ModelConfig, mesh: jax.sharding.Mesh, seed: int = 0) -> Qwen3_5:
    """A randomly initialised model whose parameters are born sharded on `mesh`."""
    with shd.use_mesh(mesh):
        return Qwen3_5(cfg, rngs=nnx.Rngs(seed))
