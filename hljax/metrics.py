"""Run metrics: one JSON line per step, TensorBoard event files, optionally Weights & Biases, PNG plots.

Appending (not rewriting) the JSONL keeps everything written before a crash; a resumed run drops
the lines of steps it is about to redo, so the file holds each step once. The other backends are
viewers of the same rows (`BACKENDS`); their packages are imported only when named.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import tempfile
from typing import Mapping, Sequence

import numpy as np

from hljax import jsonl

# The curves a person looks at first; others are in the JSONL and TensorBoard.
MAIN_CURVES = (
    ("reward/mean", "reward"),
    ("valid_rate", "edit validity"),
    ("ran_rate", "runs without error"),
    ("score/mean", "scoring-set score"),
    ("loss", "loss"),
    ("kl", "KL to reference"),
    ("entropy", "entropy"),
    ("sampler_logprob_gap", "|sampler - trainer| logprob"),
)


# Backend name -> (the module it imports, the pip extra that installs it). "jsonl" is always on:
# curves.png, resume and the summary read metrics.jsonl.
BACKENDS = {"jsonl": ("json", ""), "tensorboard": ("tensorboardX", ""), "wandb": ("wandb", "wandb")}


def check_backends(backends, key: str = "metrics.backends", installed: bool = True) -> None:
    """Every name in `backends` is known, "jsonl" among them, and (`installed`) its package importable;
    ValueError naming the fix if not."""
    unknown = [b for b in backends if b not in BACKENDS]
    if unknown:
        raise ValueError(f"{key}: unknown backend(s) {unknown}; valid: {sorted(BACKENDS)}")
    if "jsonl" not in backends:
        raise ValueError(f"{key}={tuple(backends)} must include 'jsonl' (curves.png, resume and the summary read "
                         "metrics.jsonl)")
    for b in backends if installed else ():
        module, extra = BACKENDS[b]
        if importlib.util.find_spec(module) is None:
            how = f"pip install -e '.[{extra}]'" if extra else f"pip install {module}"
            raise ValueError(f"{key} names {b!r}, but the {module} package is not installed: {how}, or drop "
                             f"{b!r} from {key}")


class MetricsWriter:
    def __init__(self, directory: str, *, resume_from_step: int | None = None,
                 backends: tuple[str, ...] = ("jsonl", "tensorboard"), wandb_project: str = "hljax",
                 config: dict | None = None, active: bool = True):
        """active=False (every process but the first of a multi-process run): write nothing, so the
        run's files are written once; `jsonl` still names the file process 0 writes. `config`: what a
        W&B run records as its config."""
        self.directory = directory
        self.jsonl = os.path.join(directory, "metrics.jsonl")
        self.tensorboard = os.path.join(directory, "tensorboard") if "tensorboard" in backends else None
        self.active = active
        self._tb = None
        self._wandb = None
        if not active:
            return
        check_backends(backends)
        os.makedirs(directory, exist_ok=True)
        if resume_from_step is not None:
            truncate_jsonl(self.jsonl, resume_from_step)
        if self.tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(self.tensorboard, flush_secs=10)
        if "wandb" in backends:
            import wandb

            # The run's folder is its id: a resumed run continues the same W&B run.
            where = os.path.abspath(directory)
            run_id = f"{os.path.basename(where)}-{hashlib.sha1(where.encode()).hexdigest()[:8]}"
            self._wandb = wandb.init(project=wandb_project, name=os.path.basename(where), id=run_id,
                                     resume="allow", dir=directory, config=config)

    def write(self, step: int, metrics: Mapping[str, float | int | str]) -> None:
        if not self.active:
            return
        row = {"step": step, **{k: _plain(v) for k, v in metrics.items()}}
        with open(self.jsonl, "a") as f:
            f.write(json.dumps(row) + "\n")
        if self._tb is not None:
            for k, v in row.items():
                if k != "step" and isinstance(v, (int, float)) and math.isfinite(v):
                    self._tb.add_scalar(k, v, step)
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in row.items() if k != "step"}, step=step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def grpo_score_quarters(rows: Sequence[Mapping], min_steps: int = 1) -> tuple[float, float, int] | None:
    """The GRPO candidates' `score/mean` in metrics rows: the mean of the first and of the last quarter of
    GRPO steps (a quarter is at least one step) and the quarter's length; None under `min_steps` steps."""
    scores = [r["score/mean"] for r in rows if r.get("stage") == "grpo" and isinstance(r.get("score/mean"), (int, float))]
    if not scores or len(scores) < min_steps:
        return None
    q = max(1, len(scores) // 4)
    return float(np.mean(scores[:q])), float(np.mean(scores[-q:])), q


def truncate_jsonl(path: str, last_step: int) -> None:
    """Drop the rows of `path` written after `last_step` (a resumed run writes them again), and a torn
    last line (a crash mid-write), with a warning."""
    if not os.path.exists(path):
        return
    kept = [r for r in jsonl.read(path, cut_torn=True) if r.get("step", -1) <= last_step]
    # Written beside it and swapped in: a crash now leaves the old rows or the new ones, never neither.
    fd, tmp = tempfile.mkstemp(prefix=f"{os.path.basename(path)}.", suffix=".tmp", dir=os.path.dirname(path) or ".")
    with os.fdopen(fd, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in kept)
    os.replace(tmp, path)


def append_jsonl(path: str, rows) -> None:
    with open(path, "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def _plain(v):
    if isinstance(v, (np.generic, np.ndarray)) or hasattr(v, "item"):
        v = np.asarray(v).item()
    return v


def read_jsonl(path: str) -> list[dict]:
    """The rows of `path`, less a last line still being written (hljax.jsonl.read)."""
    return jsonl.read(path)


def stage_starts(rows: Sequence[Mapping]) -> list[tuple[int, str]]:
    """(first step, stage) of every stage after the first, in step order: where curves.png draws a line."""
    out, previous = [], None
    for r in sorted((r for r in rows if "stage" in r), key=lambda r: r["step"]):
        if previous is not None and r["stage"] != previous:
            out.append((r["step"], r["stage"]))
        previous = r["stage"]
    return out


def plot_curves(rows: Sequence[Mapping], out_png: str, curves=MAIN_CURVES, title: str = "") -> str | None:
    """A grid of the main curves present in `rows`, a dotted line where a stage (SFT, GRPO) starts;
    returns the PNG path, or None if no curve is present."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    present = [(k, label) for k, label in curves if any(isinstance(r.get(k), (int, float)) for r in rows)]
    if not present:
        return None
    starts = stage_starts(rows)
    cols = min(3, len(present))
    rows_n = math.ceil(len(present) / cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(4.2 * cols, 3.0 * rows_n), squeeze=False)
    for ax, (key, label) in zip(axes.flat, present):
        pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
        xs, ys = zip(*pts)
        ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, lw=1.5)
        for step, stage in starts:
            if xs[0] < step <= xs[-1]:
                ax.axvline(step - 0.5, color="grey", linestyle=":", lw=1)
                ax.annotate(stage.upper(), (step - 0.5, 1.0), xycoords=("data", "axes fraction"), ha="left",
                            va="top", fontsize=7, color="grey")
        ax.set_title(label)
        ax.set_xlabel("step")
        ax.set_ylabel(key)  # The metrics.jsonl / TensorBoard name of what is plotted.
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(present):]:
        ax.axis("off")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png
