"""Which NNX class and cache a `ModelConfig` needs: Qwen3 (dense) or Qwen3.5 (hybrid)."""

from __future__ import annotations

import jax
from flax import nnx

from hljax import sharding as shd
from hljax.models import qwen3, qwen3_5
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
