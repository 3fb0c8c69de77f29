"""Which NNX class and cache a `ModelConfig` needs: Qwen3 (dense) or Qwen3.5 (hybrid)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from hljax import sharding as shd
from hljax.models import ops, qwen3, qwen3_5
from hljax.models.config import ModelConfig

Model = qwen3.Qwen3 | qwen3_5.Qwen3_5


def model_class(cfg: ModelConfig) -> type:
    return qwen3_5.Qwen3_5 if cfg.is_hybrid else qwen3.Qwen3


def init_cache(cfg: ModelConfig, batch: int, max_len: int, dtype=None) -> list:
    """The decode cache of `cfg`'s model: KV caches, plus fixed-size linear-attention states for Qwen3.5."""
    module = qwen3_5 if cfg.is_hybrid else qwen3
    return module.init_cache(cfg, batch, max_len, dtype)


def create(cfg: ModelConfig, mesh: jax.sharding.Mesh, seed: int = 0) -> Model:
    """A randomly initialised model of `cfg`'s architecture, born sharded on `mesh`."""
    with shd.use_mesh(mesh):
        return model_class(cfg)(cfg, rngs=nnx.Rngs(seed))


def copy_rows(dst: list, src: list, src_rows: jax.Array, dst_rows: jax.Array) -> list:
    """Row src_rows[r] of cache `src` into row dst_rows[r] of cache `dst` (a dst row out of range is
    skipped: padding). KV caches copy their first W slots (src's length, at most dst's); Qwen3.5's
    linear-attention states, which have no slots, copy whole. This is how one prefilled prompt serves
    several decode rows (its n samples) without being prefilled again."""
    def one(d, s):
        if isinstance(d, qwen3.LayerCache):
            return qwen3.LayerCache(ops.copy_slots(d.k, s.k, src_rows, dst_rows), ops.copy_slots(d.v, s.v, src_rows, dst_rows))
        return jax.tree.map(lambda a, b: a.at[dst_rows].set(b[src_rows].astype(a.dtype), mode="drop"), d, s)

    return [one(d, s) for d, s in zip(dst, src)]


def grow_cache(cache: list, extra_rows: int, extra_len: int) -> list:
    """`cache` with `extra_rows` more (zero) rows, and KV caches `extra_len` more slots; Qwen3.5's
    linear-attention states have no slots and grow rows only."""
    def pad(a, axes: dict[int, int]):
        return jnp.pad(a, [(0, axes.get(i, 0)) for i in range(a.ndim)])

    return [jax.tree.map(lambda a: pad(a, {0: extra_rows, 2: extra_len}), c) if isinstance(c, qwen3.LayerCache)
            else jax.tree.map(lambda a: pad(a, {0: extra_rows}), c) for c in cache]
