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
from hljax.models.dense import dense, kernel_attention, kernel_kv_write, kernel_logits, kernel_take
from hljax.models.rope import apply_rope, cos_sin, inv_frequencies

# Finite so fully masked rows (left padding) give a uniform softmax instead of NaN.
_MASKED = -1e30


def _param(rngs: nnx.Rngs, init, shape: tuple[int, ...], names: tuple[str | None, ...], dtype,
           dense_in: int | None = None) -> nnx.Param:
    """dense_in: for a projection weight, how many leading dims `dense.dense` contracts."""
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
        rows = jnp.arange(k.shape[0])

        def put(c, x):
            written = kernel_kv_write(c, x[:, :, 0], cache_index)
            if written is None:
                written = scatter_bits(c, (rows, slice(None), cache_index), x[:, :, 0].astype(c.dtype))
            return written
    return LayerCache(put(cache.k, k), put(cache.v, v))


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


def embed_lookup(embed: nnx.Variable, tokens: jax.Array, dtype) -> jax.Array:
    """embed: the [V, D] table; tokens [B, T] -> rows [B, T, D] in `dtype`.

    A 16-bit table is gathered as raw bits: XLA:CPU gathers bf16 by converting the whole table to
    fp32 first, and hoists that copy out of the decode loop (0.62 GB held for the Qwen3-0.6B shape).
    The bit-cast is itself a table-sized copy there (0.31 GB), so the engine's CPU kernels look rows
    up directly (`dense.kernel_take`)."""
    rows = kernel_take(embed, tokens)
    if rows is not None:
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


def decode_mask(kv_valid: jax.Array, cache_index, T: int, width: int) -> jax.Array:
    """[B, T, width] bool: query t of row b (at slot cache_index (+ b's own, when [B]) + t) sees the
    slots up to its own that kv_valid marks real."""
    at = jnp.reshape(cache_index, (-1, 1)) + jnp.arange(T)  # [B or 1, T]
    causal = jnp.arange(width)[None, None, :] <= at[:, :, None]
    return causal & kv_valid[:, :width].astype(bool)[:, None, :]


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
        act_kv = (shd.ACT_BATCH, shd.ACT_KV_HEADS, shd.ACT_LENGTH, shd.ACT_HEAD_DIM)
        q = shd.constrain(self.q_norm(self._proj(x, "q_proj")), act_heads)
        k = self.k_norm(self._proj(x, "k_proj"))
        v = self._proj(x, "v_proj")
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k = shd.constrain(k.transpose(0, 2, 1, 3), act_kv)  # [B, K, T, H]
        v = shd.constrain(v.transpose(0, 2, 1, 3), act_kv)

        if cache is not None:
            cache = write_kv(cache, k, v, cache_index)
            if mask.shape[-1] != T:  # Decode: attend over the whole cache. Prefill: over the fresh keys.
                k, v = cache.k, cache.v

        # The kernel reads the cache in its stored dtype: a cast here would convert every slot each step.
        out = kernel_attention(q, k, v, mask, cfg.head_dim**-0.5, jnp.max(cache_index) + T) if cache is not None else None
        if out is None:
            k, v = k.astype(x.dtype), v.astype(x.dtype)
            q = q.reshape(B, T, cfg.num_kv_heads, cfg.num_groups, cfg.head_dim).transpose(0, 2, 3, 1, 4)  # [B, K, G, T, H]
            scores = jnp.einsum("BKGTH,BKSH->BKGTS", q, k, preferred_element_type=jnp.float32)
            scores = scores * (cfg.head_dim**-0.5)
            scores = jnp.where(mask[:, None, None, :, :], scores, _MASKED)
            probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
            out = jnp.einsum("BKGTS,BKSH->BKGTH", probs, v)  # [B, K, G, T, H]
            out = out.transpose(0, 3, 1, 2, 4).reshape(B, T, cfg.num_heads * cfg.head_dim)
        y = dense(out, self.o_proj)
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
    """h: [B, T, D] -> fp32 logits [B, T, V] of a Qwen3 or Qwen3.5 model (through the CPU kernels when the weights were prepared for them)."""
    tied = model.cfg.tie_word_embeddings
    out = kernel_logits(h, model.embed if tied else model.lm_head)
    if out is None:
        return project(h, model.head_weight(), vocab_major=tied)
    return shd.constrain(out, (shd.ACT_BATCH, shd.ACT_LENGTH, shd.ACT_VOCAB))


def project(h: jax.Array, w: jax.Array, vocab_major: bool) -> jax.Array:
    """h: [B, T, D], w: [V, D] (vocab_major, a tied embedding) or [D, V] -> logits [B, T, V] fp32.

    The tied embedding is contracted in its own layout: transposing a 151k x D matrix every decode
    step would cost more than the projection itself."""
    eq = "BTD,VD->BTV" if vocab_major else "BTD,DV->BTV"
    logits = jnp.einsum(eq, h, w.astype(h.dtype), preferred_element_type=jnp.float32)
    return shd.constrain(logits, (shd.ACT_BATCH, shd.ACT_LENGTH, shd.ACT_VOCAB))


def create(cfg: ModelConfig, mesh: jax.sharding.Mesh, seed: int = 0) -> Qwen3:
    """A randomly initialised model whose parameters are born sharded on `mesh`."""
    with shd.use_mesh(mesh):
        return Qwen3(cfg, rngs=nnx.Rngs(seed))
