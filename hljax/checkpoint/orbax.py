"""Train-state checkpoints with orbax: three items per step, the model's parameters (`model`), the
optimiser state (`optimizer`) and a JSON record (`meta`).

The trainer's record holds the step, the stage (sft or grpo: whose optimiser the state belongs to)
and the run seed. Nothing else is needed to resume: everything a step draws (its SFT batch, revision
states, scoring window and sampling seeds) derives from (seed, step), so the step is the data cursor
and no host RNG state carries over between steps; the resolved config is run_dir/config.json.

The items are separate so that `restore_model` reads the weights alone (an export needs no
optimiser). Saves are asynchronous (the step loop goes on while arrays are written); `keep` bounds
the number kept. Restores place every array with the sharding of the live model, so a checkpoint
written on one mesh restores onto another.
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
        self._manager.save(
            step,
            args=ocp.args.Composite(
                model=ocp.args.StandardSave(nnx.to_pure_dict(nnx.state(model))),
                optimizer=ocp.args.StandardSave(nnx.to_pure_dict(nnx.state(optimizer))),
                meta=ocp.args.JsonSave(meta),
            ),
            force=True,
        )

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def read_meta(self, step: int) -> dict:
        """The JSON record of `step` alone (step, stage, seed)."""
        return self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]

    def restore(self, model: nnx.Module, optimizer: nnx.Optimizer, step: int | None = None) -> dict | None:
        """Load `step` (default: latest) into `model` and `optimizer` in place; -> its meta, or None if
        there is no checkpoint. The optimizer must have the structure it was saved with."""
        step = self.latest_step() if step is None else step
        if step is None:
            return None
        model_state, opt_state = nnx.state(model), nnx.state(optimizer)
        restored = self._manager.restore(step, args=ocp.args.Composite(
            model=ocp.args.StandardRestore(_abstract(nnx.to_pure_dict(model_state))),
            optimizer=ocp.args.StandardRestore(_abstract(nnx.to_pure_dict(opt_state))),
            meta=ocp.args.JsonRestore(),
        ))
        nnx.replace_by_pure_dict(model_state, restored["model"])
        nnx.update(model, model_state)
        nnx.replace_by_pure_dict(opt_state, restored["optimizer"])
        nnx.update(optimizer, opt_state)
        log.info("restored step %d from %s", step, self.directory)
        return restored["meta"]

    def restore_model(self, model: nnx.Module, step: int | None = None) -> dict | None:
        """Load the parameters of `step` (default: latest) into `model` in place, leaving the optimiser
        state on disk; -> its meta, or None if there is no checkpoint."""
        step = self.latest_step() if step is None else step
        if step is None:
            return None
        model_state = nnx.state(model)
        restored = self._manager.restore(step, args=ocp.args.Composite(
            model=ocp.args.StandardRestore(_abstract(nnx.to_pure_dict(model_state))), meta=ocp.args.JsonRestore()))
        nnx.replace_by_pure_dict(model_state, restored["model"])
        nnx.update(model, model_state)
        log.info("restored the model of step %d from %s", step, self.directory)
        return restored["meta"]

    def wait(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()
