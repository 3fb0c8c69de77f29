"""Train-state checkpoints with orbax: params, optimizer state, step, and a JSON record of everything
else a resume needs (host RNG states, data cursor, the resolved config).

Saves are asynchronous (the step loop goes on while arrays are written); `keep` bounds the number
kept. Restores place every array with the sharding of the live model, so a checkpoint written on one
mesh restores onto another.
"""

from __future__ import annotations

import logging
import os

import jax
import orbax.checkpoint as ocp
from flax import nnx

log = logging.getLogger(__name__)


def _abstract(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


class TrainCheckpointer:
    def __init__(self, directory: str, *, keep: int = 3, async_save: bool = True):
        self.directory = os.path.abspath(directory)
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=async_save, create=True)
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def save(self, step: int, model: nnx.Module, optimizer: nnx.Optimizer, meta: dict) -> None:
        """Start writing step `step`; returns before the arrays are on disk when async."""
        state = {"model": nnx.to_pure_dict(nnx.state(model)), "optimizer": nnx.to_pure_dict(nnx.state(optimizer))}
        self._manager.save(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
            force=True,
        )

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def read_meta(self, step: int) -> dict:
        """The JSON record of `step` alone (stage, seed, ...), e.g. to rebuild its optimiser first."""
        return self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]

    def restore(self, model: nnx.Module, optimizer: nnx.Optimizer, step: int | None = None) -> dict | None:
        """Load `step` (default: latest) into `model` and `optimizer` in place; -> its meta, or None if
        there is no checkpoint. The optimizer must have the structure it was saved with."""
        step = self.latest_step() if step is None else step
        if step is None:
            return None
        model_state = nnx.state(model)
        opt_state = nnx.state(optimizer)
        target = {"model": _abstract(nnx.to_pure_dict(model_state)), "optimizer": _abstract(nnx.to_pure_dict(opt_state))}
        restored = self._manager.restore(
            step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore())
        )
        nnx.replace_by_pure_dict(model_state, restored["state"]["model"])
        nnx.update(model, model_state)
        nnx.replace_by_pure_dict(opt_state, restored["state"]["optimizer"])
        nnx.update(optimizer, opt_state)
        log.info("restored step %d from %s", step, self.directory)
        return restored["meta"]

    def wait(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()
