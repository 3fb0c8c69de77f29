"""`ColocatedGenerator`: our engine in the trainer's process, handed new weights as arrays.

The rollout backend `colocated` (issue 39): no HTTP and no disk round trip per GRPO step. Requests
from the trainer's threads join one continuous batch (the embedded server's `BatchRunner`, without
the server), so a step's groups decode together and sample exactly what the embedded server would
for the same seeds. A sync casts and reshards each trainer parameter into the engine's layout
(`served_copy`), then swaps it in between batches (`Engine.set_model`, which packs it for the CPU
kernels where they are on); the trainer's buffers are never shared, since its train step donates them.
"""

from __future__ import annotations

import dataclasses
import functools
import logging

import jax
from flax import nnx

from hljax import sharding as shd
from hljax.generate.engine import Output, Request
from hljax.generate.local import LocalGenerator
from hljax.generate.server import BatchRunner
from hljax.models import registry
from hljax.models.config import ModelConfig

log = logging.getLogger(__name__)

# How the engine stores and runs the weights, not what they are: these may differ from the trainer's.
SERVING_FIELDS = ("dtype", "param_dtype", "remat", "attention_kernel", "linear_chunk_size")


def architecture_diff(a: ModelConfig, b: ModelConfig) -> list[str]:
    """Fields (serving ones aside) in which two configs differ."""
    return [f.name for f in dataclasses.fields(a)
            if f.compare and f.name not in SERVING_FIELDS and getattr(a, f.name) != getattr(b, f.name)]


def served_copy(model: registry.Model, cfg: ModelConfig, mesh: jax.sharding.Mesh) -> registry.Model:
    """`model`'s weights as a model of `cfg` (the engine's dtypes) sharded for `mesh`: each parameter
    cast and placed as the engine's loader would place it, in new buffers (never the trainer's).
    `model`'s parameters must be addressable by this process (the trainer gathers them when there
    are several processes)."""
    if diff := architecture_diff(model.cfg, cfg):
        raise ValueError(f"the trainer's model differs from the served one in {diff}")
    graphdef, abstract, shardings = _layout(cfg, mesh)
    source = dict(nnx.to_flat_state(nnx.state(model)))
    if missing := sorted(".".join(map(str, p)) for p, _ in abstract if p not in source):
        raise ValueError(f"the trainer's model lacks {missing[:5]}")
    flat = []
    for (path, var), sharding in zip(abstract, shardings):
        src = source[path].get_value()
        if src.shape != var.shape:
            raise ValueError(f"{'.'.join(map(str, path))}: trainer shape {src.shape}, served {var.shape}")
        if src.dtype != var.dtype:
            value = jax.device_put(src.astype(var.dtype), sharding)  # astype made a new buffer already.
        else:
            value = jax.device_put(src, sharding, may_alias=False)
        flat.append((path, var.replace(value)))
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


@functools.lru_cache(maxsize=4)
def _layout(cfg: ModelConfig, mesh: jax.sharding.Mesh):
    """(graphdef, [(path, abstract variable)], [sharding]) of the served model: traced once per config,
    not at every sync."""
    with shd.use_mesh(mesh):
        abstract = nnx.eval_shape(lambda: registry.model_class(cfg)(cfg, rngs=nnx.Rngs(0)))
    graphdef, abs_state = nnx.split(abstract)
    flat = list(nnx.to_flat_state(abs_state))
    shardings = dict(nnx.to_flat_state(shd.param_shardings(abs_state, mesh)))
    return graphdef, flat, [shardings[p].get_value() for p, _ in flat]


class ColocatedGenerator(LocalGenerator):
    """`LocalGenerator` whose callers share one continuous batch; a `TrainableGenerator` that also
    takes weights in memory (`update_weights_from_model`)."""

    def __init__(self, local: LocalGenerator):
        super().__init__(local.engine, local.tokenizer)
        self.runner = BatchRunner(self)

    def _decode(self, requests: list[Request]) -> list[Output]:
        return self.runner.submit(requests)

    def update_weights_from_model(self, model: registry.Model, weight_version: str | None = None) -> None:
        """Serve `model`'s current weights from the next batch on (a batch in flight keeps its own)."""
        self.engine.set_model(served_copy(model, self.engine.model_config, self.engine.mesh), weight_version)

    def stop(self) -> None:
        self.runner.stop()

