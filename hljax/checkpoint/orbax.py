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

A step whose files were cut short (a crash or a full disk mid-write, a copy that stopped) fails to
restore; `newest_readable` finds the newest step that restores, and `set_aside` moves a damaged one
out of the way (renamed, never deleted) so that the run can save that step again.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import re
import sys
import threading
from typing import Callable, TypeVar

import jax
import orbax.checkpoint as ocp
from flax import nnx

log = logging.getLogger(__name__)
T = TypeVar("T")


class CheckpointUnreadable(RuntimeError):
    """No saved step restores: each is damaged, or the checkpoints were saved from another model."""


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

    def newest_readable(self, load: Callable[[int], T]) -> tuple[int | None, T | None, list[tuple[int, str]]]:
        """Call `load(step)` on the saved steps, newest first, until one returns: -> (that step, what it
        returned, [(newer step, why it failed)]), or (None, None, []) without checkpoints.

        A step that fails where an older one restores is damaged: the same code read the older one.
        When none restores, nothing is judged damaged (the checkpoints may fit another model):
        CheckpointUnreadable names every step and why."""
        failed: list[tuple[int, str]] = []
        found = None
        # Before the first read: a failed read's sibling reads report as soon as their loop is closed,
        # before the failure reaches the except below (seen on a fast host).
        _quiet_closed_loop_reports()
        with _abandoned_reads_collected():
            for step in reversed(self.all_steps()):
                try:
                    found = step, load(step)
                    break
                except Exception as e:  # noqa: BLE001 - any failure to read back; the caller is told which.
                    failed.append((step, why(e)))
        if found is not None:
            return found[0], found[1], failed
        if failed:
            steps = "; ".join(f"step {s}: {reason}" for s, reason in failed)
            raise CheckpointUnreadable(f"{self.directory}: no checkpoint restores ({steps}): if they are "
                                       "damaged, move the folder aside to start the run over")
        return None, None, []

    def set_aside(self, step: int) -> str:
        """Rename step `step`'s folder (a damaged one: kept to look at, never deleted) so that it is no
        longer a checkpoint and the step can be saved again; -> its new path."""
        src = os.path.join(self.directory, str(step))
        dst, n = f"{src}.damaged", 1
        while os.path.lexists(dst):
            n += 1
            dst = f"{src}.damaged-{n}"
        os.replace(src, dst)
        self._manager.reload()  # The manager lists steps once; it must forget this one.
        return dst

    def reload(self) -> None:
        """See steps another process set aside."""
        self._manager.reload()

    def wait(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()


def why(error: BaseException, limit: int = 240) -> str:
    """The root cause of `error` in one line: orbax wraps the file error (the useful part) in pages of
    TensorStore spec."""
    while error.__cause__ is not None:
        error = error.__cause__
    first = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
    text = f"{type(error).__name__}: {first}" if first else type(error).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _ClosedLoopNoise(logging.Filter):
    """Drops "Event loop is closed" errors: after a failed read, orbax's other reads still finish in
    worker threads and try to hand their result to its closed event loop; concurrent.futures logs each
    as an error with a traceback, at any time later (seen under load). The damage is reported once."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not _closed_loop(record.exc_info[1] if record.exc_info else None)


_CLOSED_LOOP_NOISE = _ClosedLoopNoise()


def _orbax_code(code) -> bool:
    """Whether a code object is orbax's own."""
    return f"{os.sep}orbax{os.sep}" in code.co_filename


def _from_orbax(exc: BaseException | None) -> bool:
    """Whether `exc`, or an error it was raised from, passed through orbax's code."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        tb = exc.__traceback__
        while tb is not None:
            if _orbax_code(tb.tb_frame.f_code):
                return True
            tb = tb.tb_next
        exc = exc.__cause__ or exc.__context__
    return False


# asyncio names the object's class: a Task, a plain Future, or gather's _GatheringFuture (CI's stop 52
# printed one that a filter for tasks alone let through).
_NEVER_RETRIEVED = re.compile(r"\w+ exception was never retrieved")


class _UnretrievedReadNoise(logging.Filter):
    """Drops asyncio's "<Task|Future|...> exception was never retrieved" for orbax's abandoned reads: when
    one read of a damaged step fails, the others fail too, and each one's error prints, with pages of
    TensorStore spec, when it is garbage collected (at any time later). The damage is reported once."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (_NEVER_RETRIEVED.match(str(record.msg)) and _from_orbax(exc))


_UNRETRIEVED_READ_NOISE = _UnretrievedReadNoise()


def _closed_loop(exc: BaseException | None) -> bool:
    return isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed"


def _loop_callback_from_native(exc: BaseException | None, tb) -> bool:
    """An "Event loop is closed" raised in `call_soon_threadsafe` called from native code (its traceback
    starts there): TensorStore handing an abandoned read's result to orbax's closed loop."""
    return _closed_loop(exc) and tb is not None and tb.tb_frame.f_code.co_name == "call_soon_threadsafe"


def _quiet_closed_loop_reports() -> None:
    """For the rest of the process (the abandoned reads' threads report at any time): their "Event loop
    is closed" errors are dropped wherever they would print (logging, a thread's end, unraisable, and
    TensorStore's own threads, which print through sys.excepthook)."""
    logging.getLogger("concurrent.futures").addFilter(_CLOSED_LOOP_NOISE)
    thread_hook, unraisable_hook, except_hook = threading.excepthook, sys.unraisablehook, sys.excepthook
    if getattr(thread_hook, "_hljax_quiet", False):
        return

    def on_thread(args):
        if not _closed_loop(args.exc_value):
            thread_hook(args)

    def on_unraisable(unraisable):
        if not _closed_loop(unraisable.exc_value):
            unraisable_hook(unraisable)

    def on_except(exc_type, exc, tb):
        if not _loop_callback_from_native(exc, tb):
            except_hook(exc_type, exc, tb)

    on_thread._hljax_quiet = True
    threading.excepthook, sys.unraisablehook, sys.excepthook = on_thread, on_unraisable, on_except


@contextlib.contextmanager
def _abandoned_reads_collected():
    """orbax reads a step's arrays in coroutines; when one read fails, the others are abandoned, and
    their failures about the same damage would print later, at garbage collection, as pages of
    "Exception ignored" tracebacks. They are collected here, quietly: the caller reports the damage."""
    hook = sys.unraisablehook

    def quiet(unraisable):
        code = getattr(unraisable.object, "cr_code", None)
        if code is None or not _orbax_code(code):
            hook(unraisable)

    sys.unraisablehook = quiet
    # Kept for the process: a task may be collected after this block, and the filter drops only
    # orbax's own reads' duplicates of an error the caller got.
    logging.getLogger("asyncio").addFilter(_UNRETRIEVED_READ_NOISE)
    try:
        yield
    finally:
        gc.collect()
        sys.unraisablehook = hook
