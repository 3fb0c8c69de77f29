"""Dense Qwen3 decoder (Qwen3-0.6B/4B/8B...) in Flax NNX.

Shapes: B batch, T query length, S key length, D hidden, N query heads, K kv heads,
G = N // K query heads per kv head, H head dim, F mlp width, V vocab.
Every parameter carries logical axis names (see `hljax.sharding`).
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx
import numpy as np

from hljax import sharding as shd
from hljax.models.config import ModelConfig
from hljax.models import ops
from hljax.models.ops import dense, embed_lookup
from hljax.models.rope import apply_rope, cos_sin, inv_frequencies


def _param(rngs: nnx.Rngs, init, shape: tuple[int, ...], names: tuple[str | None, ...], dtype,
           dense_in: int | None = None) -> nnx.Param:
    """dense_in: for a projection weight, how many leading dims `ops.dense` contracts."""
    value = nnx.with_partitioning(init, names)(rngs.params(), shape, dtype)
    return nnx.Param(value) if dense_in is None else nnx.Param(value, dense_in=dense_in)


_normal = nnx.initializers.normal(0.02)
_ones = nnx.initializers.ones
_zeros = nnx.initializers.zeros


@flax.struct.dataclass
class LayerCache:
    """Static KV cache of one layer; slot s holds the key/value written at cache position s."""

    # Heads before slots, so attention contracts the cache in its stored layout (no per-step transpose).
    k: jax.Array  # [B, K, S, H]
    v: jax.Array  # [B, K, S, H]


def write_kv(cache: LayerCache, k: jax.Array, v: jax.Array, cache_index) -> LayerCache:
    """k, v: [B, K, T, H] written at slots [i, i + T) of `cache`.

    cache_index: a scalar (every row at the same slots, as a left-padded batch is), or [B] int with
    T == 1 (one slot per row: the engine's continuous batch, whose rows sit at different steps)."""
    if jnp.ndim(cache_index) == 0:
        put = lambda c, x: jax.lax.dynamic_update_slice_in_dim(c, x.astype(c.dtype), cache_index, axis=2)  # noqa: E731
    else:
        put = lambda c, x: ops.write_slots(c, x[:, :, 0], cache_index)  # noqa: E731
    return LayerCache(put(cache.k, k), put(cache.v, v))


def attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, cache: LayerCache | None, cache_index,
           scale: float, dtype, kernel: bool) -> tuple[jax.Array, LayerCache | None]:
    """Attention of a Qwen3 or Qwen3.5 attention layer, its keys and values written to `cache`.

    q: [B, T, N, H]; k, v: [B, T, K, H], the fresh tokens' (rotated); mask: [B, T, S] bool, S = T
    (self-attention: training, prefill, a shared prefix) or the cache's slots (decode: attend over the
    whole cache) -> ([B, T, N, H] in `dtype`, cache). kernel: the model's `attention_kernel`."""
    T = q.shape[1]
    if cache is not None and ops.prefill_kernel(q, mask, cache.k):
        out, k_cache, v_cache = ops.prefill_attention(q, k, v, mask, scale, cache.k.dtype)
        return out.astype(dtype), LayerCache(k_cache, v_cache)
    act_kv = (shd.ACT_BATCH, shd.ACT_KV_HEADS, shd.ACT_LENGTH, shd.ACT_HEAD_DIM)
    k = shd.constrain(k.transpose(0, 2, 1, 3), act_kv)  # [B, K, T, H]
    v = shd.constrain(v.transpose(0, 2, 1, 3), act_kv)
    if cache is not None:
        cache = write_kv(cache, k, v, cache_index)
        if mask.shape[-1] != T:  # Decode: attend over the whole cache. Prefill: over the fresh keys.
            k, v = cache.k, cache.v
    filled = None if cache is None else jnp.max(cache_index) + T
    # A mask over the fresh keys alone (training, prefill, a shared prefix) is causal: blocks skip ahead.
    out = ops.attention(q, k, v, mask, scale, dtype, filled, causal=mask.shape[-1] == T, kernel=kernel)
    return out, cache


def decode_mask(kv_valid: jax.Array, cache_index, T: int, width: int) -> jax.Array:
    """[B, T, width] bool: query t of row b (at slot cache_index (+ b's own, when [B]) + t) sees the
    slots up to its own that kv_valid marks real."""
    at = jnp.reshape(cache_index, (-1, 1)) + jnp.arange(T)  # [B or 1, T]
    causal = jnp.arange(width)[None, None, :] <= at[:, :, None]
    return causal & kv_valid[:, :width].astype(bool)[:, None, :]


class SharedPrefix:
    """Masks and positions of rows that continue shared prefixes, each prefix run once.

    prefix_mask: [P, Lp], LEFT-padded (a linear-attention state then meets padding only before any
    real token, where it stays zero); attention_mask: [P * G, Ls], right-padded, row r continuing
    prefix r // G. A continuation's keys: slots [0, Lp) hold its prefix's, slots Lp + t its own."""

    def __init__(self, prefix_mask: jax.Array, attention_mask: jax.Array):
        (P, self.Lp), (B, self.Ls) = prefix_mask.shape, attention_mask.shape
        if B % P:
            raise ValueError(f"{B} continuation rows do not split into groups over {P} prefixes")
        self.G = B // P
        prefix_len = prefix_mask.sum(axis=1)
        self.prefix_positions = jnp.maximum(jnp.cumsum(prefix_mask, axis=1) - 1, 0)
        self.positions = jnp.repeat(prefix_len, self.G)[:, None] + jnp.maximum(jnp.cumsum(attention_mask, axis=1) - 1, 0)
        self.prefix_valid = prefix_mask.astype(bool)
        self.valid = attention_mask.astype(bool)
        causal = jnp.arange(self.Lp)[None, :] <= jnp.arange(self.Lp)[:, None]
        self.prefix_attention = causal[None] & self.prefix_valid[:, None, :]  # [P, Lp, Lp]
        kv_valid = jnp.concatenate([jnp.repeat(prefix_mask, self.G, axis=0), attention_mask], axis=1)
        self.attention = decode_mask(kv_valid, self.Lp, self.Ls, self.Lp + self.Ls)  # [B, Ls, Lp + Ls]

    def embed(self, model, prefix_tokens: jax.Array, tokens: jax.Array):
        """-> ((x, cos, sin) of the prefixes, (x, cos, sin) of the rows): embeddings and rotary tables
        of a Qwen3 or Qwen3.5 `model`, at the positions above."""
        cfg = model.cfg
        inv_freq = np.asarray(model.inv_freq, np.float32)
        act = (shd.ACT_BATCH, shd.ACT_LENGTH, shd.ACT_EMBED)
        return tuple((shd.constrain(embed_lookup(model.embed, t, cfg.dtype), act),
                      *cos_sin(pos, inv_freq, model.rope_scaling, cfg.dtype))
                     for t, pos in ((prefix_tokens, self.prefix_positions), (tokens, self.positions)))

    def repeat(self, x: jax.Array) -> jax.Array:
        """[P, ...] per prefix -> [P * G, ...] per continuation row."""
        return jnp.repeat(x, self.G, axis=0)

    def empty_kv(self, cfg: ModelConfig) -> LayerCache:
        """A cache the prefix's keys and values are written to (then read back by `shared_kv`)."""
        z = jnp.zeros((self.prefix_valid.shape[0], cfg.num_kv_heads, self.Lp, cfg.head_dim), cfg.dtype)
        return LayerCache(z, z)

    def shared_kv(self, kv: LayerCache) -> LayerCache:
        """The prefix's [P, K, Lp, H] keys and values -> each row's [B, K, Lp + Ls, H] cache."""
        def one(c):
            fresh = jnp.zeros((c.shape[0] * self.G, c.shape[1], self.Ls, c.shape[3]), c.dtype)
            return jnp.concatenate([self.repeat(c), fresh], axis=2)
        return LayerCache(one(kv.k), one(kv.v))


def init_cache(cfg: ModelConfig, batch: int, max_len: int, dtype=None) -> list[LayerCache]:
    shape = (batch, cfg.num_kv_heads, max_len, cfg.head_dim)
    dtype = dtype or cfg.dtype
    return [LayerCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)) for _ in range(cfg.num_layers)]


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float, *, names: tuple[str | None, ...], param_dtype, rngs: nnx.Rngs):
        self.scale = _param(rngs, _ones, (dim,), names, param_dtype)
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        # Normalise in fp32 whatever the compute dtype, as HF does.
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return self.scale[...].astype(x.dtype) * y.astype(x.dtype)


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        D, N, K, H, pd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.param_dtype
        self.q_proj = _param(rngs, _normal, (D, N, H), (shd.EMBED, shd.HEADS, shd.HEAD_DIM), pd, dense_in=1)
        self.k_proj = _param(rngs, _normal, (D, K, H), (shd.EMBED, shd.KV_HEADS, shd.HEAD_DIM), pd, dense_in=1)
        self.v_proj = _param(rngs, _normal, (D, K, H), (shd.EMBED, shd.KV_HEADS, shd.HEAD_DIM), pd, dense_in=1)
        self.o_proj = _param(rngs, _normal, (N, H, D), (shd.HEADS, shd.HEAD_DIM, shd.EMBED), pd, dense_in=2)
        if cfg.attention_bias:
            self.q_bias = _param(rngs, _zeros, (N, H), (shd.HEADS, shd.HEAD_DIM), pd)
            self.k_bias = _param(rngs, _zeros, (K, H), (shd.KV_HEADS, shd.HEAD_DIM), pd)
            self.v_bias = _param(rngs, _zeros, (K, H), (shd.KV_HEADS, shd.HEAD_DIM), pd)
            self.o_bias = _param(rngs, _zeros, (D,), (shd.EMBED,), pd)
        self.q_norm = RMSNorm(H, cfg.rms_norm_eps, names=(shd.HEAD_DIM,), param_dtype=pd, rngs=rngs)
        self.k_norm = RMSNorm(H, cfg.rms_norm_eps, names=(shd.HEAD_DIM,), param_dtype=pd, rngs=rngs)
        self.cfg = cfg

    def _proj(self, x, name):
        """x: [B, T, D] -> [B, T, n, H] through the [D, n, H] weight."""
        y = dense(x, getattr(self, name))
        if self.cfg.attention_bias:
            y = y + getattr(self, name.replace("proj", "bias"))[...].astype(x.dtype)
        return y

    def __call__(self, x, cos, sin, mask, cache: LayerCache | None, cache_index):
        """x: [B, T, D]; cos, sin: [B, T, H]; mask: [B, T, S] bool -> ([B, T, D], cache)."""
        cfg = self.cfg
        B, T, _ = x.shape
        act_heads = (shd.ACT_BATCH, shd.ACT_LENGTH, shd.ACT_HEADS, shd.ACT_HEAD_DIM)
        q = shd.constrain(self.q_norm(self._proj(x, "q_proj")), act_heads)
        k = self.k_norm(self._proj(x, "k_proj"))
        v = self._proj(x, "v_proj")
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out, cache = attend(q, k, v, mask, cache, cache_index, cfg.head_dim**-0.5, x.dtype, cfg.attention_kernel)
        y = dense(out.reshape(B, T, -1), self.o_proj)
        if cfg.attention_bias:
            y = y + self.o_bias[...].astype(x.dtype)
        return y, cache


class MLP(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        D, F, pd = cfg.hidden_size, cfg.intermediate_size, cfg.param_dtype
        self.gate_proj = _param(rngs, _normal, (D, F), (shd.EMBED, shd.MLP), pd, dense_in=1)
        self.up_proj = _param(rngs, _normal, (D, F), (shd.EMBED, shd.MLP), pd, dense_in=1)
        self.down_proj = _param(rngs, _normal, (F, D), (shd.MLP, shd.EMBED), pd, dense_in=1)

    def __call__(self, x: jax.Array) -> jax.Array:
        """x: [B, T, D] -> [B, T, D]; SwiGLU."""
        gate, up = dense(x, self.gate_proj), dense(x, self.up_proj)
        h = shd.constrain(jax.nn.silu(gate) * up, (shd.ACT_BATCH, shd.ACT_LENGTH, shd.ACT_MLP))
        return dense(h, self.down_proj)


class DecoderLayer(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        pd = cfg.param_dtype
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, names=(shd.NORM,), param_dtype=pd, rngs=rngs)
        self.attn = Attention(cfg, rngs=rngs)
        self.post_attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, names=(shd.NORM,), param_dtype=pd, rngs=rngs)
        self.mlp = MLP(cfg, rngs=rngs)

    def __call__(self, x, cos, sin, mask, cache, cache_index):
        h, cache = self.attn(self.input_norm(x), cos, sin, mask, cache, cache_index)
        x = x + h
        x = x + self.mlp(self.post_attn_norm(x))
        return shd.constrain(x, (shd.ACT_BATCH, shd.ACT_LENGTH, shd.ACT_EMBED)), cache


class Qwen3(nnx.Module):
    """Causal LM. Positions are explicit so left-padded batches rotate each row from its own 0."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        pd = cfg.param_dtype
        self.embed = _param(rngs, _normal, (cfg.vocab_size, cfg.hidden_size), (shd.VOCAB, shd.EMBED), pd)
        self.layers = nnx.List([DecoderLayer(cfg, rngs=rngs) for _ in range(cfg.num_layers)])
        self.final_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, names=(shd.NORM,), param_dtype=pd, rngs=rngs)
        if not cfg.tie_word_embeddings:
            self.lm_head = _param(rngs, _normal, (cfg.hidden_size, cfg.vocab_size), (shd.EMBED, shd.VOCAB), pd, dense_in=1)
        inv_freq, self.rope_scaling = inv_frequencies(cfg.rope, cfg.head_dim)
        self.inv_freq = tuple(inv_freq.tolist())  # Static: a hashable constant, not a parameter.

    def __call__(self, tokens: jax.Array, positions: jax.Array, attention_mask: jax.Array) -> jax.Array:
        """tokens, positions, attention_mask (1 = real token): [B, T] -> logits [B, T, V]."""
        return self.logits(self.hidden_states(tokens, positions, attention_mask))

    def hidden_states(self, tokens, positions, attention_mask) -> jax.Array:
        """-> final-norm hidden states [B, T, D], for callers that project to the vocab in chunks."""
        T = tokens.shape[1]
        valid = attention_mask.astype(bool)
        causal = jnp.arange(T)[None, :] <= jnp.arange(T)[:, None]  # [T, S]
        mask = causal[None] & valid[:, None, :]  # [B, T, S]
        h, _ = self._decode(tokens, positions, mask, None, 0)
        return h

    def shared_prefix_hidden_states(self, prefix_tokens, prefix_mask, tokens, attention_mask) -> jax.Array:
        """Rows that continue a shared prefix, the prefix run once for all of them (`SharedPrefix`).

        -> final-norm hidden states [P * G, Ls, D] of the continuations: those of each row run whole
        (its prefix's real tokens, then its own), the prefix's work done once instead of G times.
        Gradients reach the prefix through its keys and values, summed over the G rows."""
        with ops.whole_causal_attention():
            return self._shared_prefix_hidden_states(prefix_tokens, prefix_mask, tokens, attention_mask)

    def _shared_prefix_hidden_states(self, prefix_tokens, prefix_mask, tokens, attention_mask) -> jax.Array:
        cfg = self.cfg
        geo = SharedPrefix(prefix_mask, attention_mask)
        (xp, cos_p, sin_p), (xs, cos_s, sin_s) = geo.embed(self, prefix_tokens, tokens)
        call = remat_call if cfg.remat else (lambda l, *a: l(*a))
        for layer in self.layers:
            xp, kv = call(layer, xp, cos_p, sin_p, geo.prefix_attention, geo.empty_kv(cfg), 0)
            xs, _ = call(layer, xs, cos_s, sin_s, geo.attention, geo.shared_kv(kv), geo.Lp)
        return self.final_norm(xs)

    def decode_step(
        self,
        tokens: jax.Array,
        positions: jax.Array,
        kv_valid: jax.Array,
        cache: list[LayerCache],
        cache_index: jax.Array,
        *,
        prefill: bool = False,
    ) -> tuple[jax.Array, list[LayerCache]]:
        """Write T new tokens at cache slots [cache_index, cache_index + T) and attend to the cache.

        tokens, positions: [B, T]; kv_valid: [B, S] (False for padding slots); cache_index: a scalar,
        or [B] (each row's own slot, T == 1; see `write_kv`)
        -> (final-norm hidden states [B, T, D], cache). Callers project only the rows they need.
        prefill=True (cache_index 0) attends over the T fresh keys only, not all S slots.
        """
        T, S = tokens.shape[1], cache[0].k.shape[2]
        mask = decode_mask(kv_valid, cache_index, T, T if prefill else S)
        return self._decode(tokens, positions, mask, cache, cache_index)

    def _decode(self, tokens, positions, mask, caches, cache_index):
        cfg = self.cfg
        x = embed_lookup(self.embed, tokens, cfg.dtype)
        x = shd.constrain(x, (shd.ACT_BATCH, shd.ACT_LENGTH, shd.ACT_EMBED))
        cos, sin = cos_sin(positions, np.asarray(self.inv_freq, np.float32), self.rope_scaling, cfg.dtype)
        call = remat_call if cfg.remat else (lambda l, *a: l(*a))
        new_caches = []
        for i, layer in enumerate(self.layers):
            cache = None if caches is None else caches[i]
            x, cache = call(layer, x, cos, sin, mask, cache, cache_index)
            new_caches.append(cache)
        return self.final_norm(x), new_caches

    def head_weight(self) -> jax.Array:
        """The output projection: the [V, D] embedding when tied, else the [D, V] lm_head."""
        return self.embed[...] if self.cfg.tie_word_embeddings else self.lm_head[...]

    def logits(self, h: jax.Array) -> jax.Array:
        """h: [B, T, D] -> logits [B, T, V] in fp32."""
        return logits(self, h)


def remat_call(layer: nnx.Module, *args):
    """layer(*args), its activations recomputed in the backward pass.

    A pure split/merge around `jax.checkpoint` rather than `nnx.remat`: nnx.remat writes the layer's
    state back to its Variables, which fails when the model was itself merged inside a JAX transform
    (the train step merges it under `jax.value_and_grad` and `jax.eval_shape`)."""
    graphdef, state = nnx.split(layer)
    return jax.checkpoint(lambda st, *a: nnx.merge(graphdef, st)(*a))(state, *args)


def logits(model, h: jax.Array) -> jax.Array:
    """h: [B, T, D] -> fp32 logits [B, T, V] of a Qwen3 or Qwen3.5 model."""
    tied = model.cfg.tie_word_embeddings
    return ops.logits(h, model.embed if tied else model.lm_head, vocab_major=tied)


def create(cfg: ModelConfig, mesh: jax.sharding.Mesh, seed: int = 0) -> Qwen3:
    """A randomly initialised model whose parameters are born sharded on `mesh`."""
    with shd.use_mesh(mesh):
        return Qwen3(cfg, rngs=nnx.Rngs(seed))
