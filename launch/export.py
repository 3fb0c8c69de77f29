"""Export a training checkpoint as an HF folder that transformers and SGLang load.

    python -m launch.export --checkpoint runs/tiny/checkpoints --out runs/tiny/hf-latest   # --step N: another step

The architecture and tokenizer come from the run's initial weights (recorded in the run's
config.json beside the checkpoints); --base overrides that folder. An existing --out is refused;
--overwrite replaces an earlier launch.export folder there, and nothing else (a run directory, a
model, the run's own export: hljax/checkpoint/owner.py).

Prompt the export as training did: its chat template with enable_thinking=False (training prompts
end with the template's empty think block; with thinking on, its answers stop being edits).
"""

import json
import os

import jax.numpy as jnp

from hljax import sharding as shd
from hljax.checkpoint import hf, owner
from hljax.checkpoint.orbax import TrainCheckpointer
from hljax.preflight import check_model_dir
from launch.common import ArgumentParser, start_up

WRITER = "launch.export"


def check(checkpoint_dir: str, step: int | None, base: str | None = None) -> tuple[str, str, int]:
    """The run's (base folder, param dtype name, step to export); raises on a bad input, loads nothing."""
    run_dir = os.path.dirname(os.path.abspath(checkpoint_dir.rstrip("/")))
    config_file = os.path.join(run_dir, "config.json")
    if not os.path.exists(config_file):
        raise FileNotFoundError(f"{config_file} not found: the checkpoints folder must sit in its run directory")
    with open(config_file) as f:
        run_cfg = json.load(f)
    ckpt = TrainCheckpointer(checkpoint_dir)
    available = ckpt.all_steps()
    ckpt.close()
    if not available:
        raise FileNotFoundError(f"{checkpoint_dir}: no checkpoint")
    step = available[-1] if step is None else step
    if step not in available:
        raise ValueError(f"{checkpoint_dir}: no step {step}; available steps: {available}")
    base = base or run_cfg["model"]["path"] or os.path.join(run_dir, "init")
    check_model_dir(base, "base", fix="give --base the HF folder the run started from (its config.json names it "
                    "as model.path; a preset run's is run_dir/init)")
    return base, run_cfg["model"]["param_dtype"], step


def export(checkpoint_dir: str, step: int, out: str, base: str, param_dtype: str, dtype: str | None = None,
           overwrite: bool = False) -> str:
    """Write checkpoint `step` as an HF folder at `out` (arguments as `check` returned them);
    `overwrite`: replace an earlier launch.export folder at `out`."""
    param_dtype = getattr(jnp, param_dtype)
    model = hf.load_hf(base, shd.make_mesh(), dtype=param_dtype, param_dtype=param_dtype)
    ckpt = TrainCheckpointer(checkpoint_dir)
    ckpt.restore_model(model, step)  # The weights alone: the optimiser state stays on disk.
    ckpt.close()
    return hf.save_hf(model, out, dtype=dtype, source_dir=base, writer=WRITER, replace=overwrite)


def main():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, help="the run's checkpoints/ folder")
    parser.add_argument("--step", type=int, default=None, help="default: the latest")
    parser.add_argument("--out", required=True)
    parser.add_argument("--base", default=None, help="initial HF folder (default: from the run's config.json)")
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier launch.export --out")
    args = parser.parse_args()
    with start_up(args.verbose):  # A bad folder, step or --out is one line, before any weights load.
        owner.check_replaceable(args.out, WRITER, args.overwrite)
        base, param_dtype, step = check(args.checkpoint, args.step, args.base)
    print(f"wrote {export(args.checkpoint, step, args.out, base, param_dtype, args.dtype, args.overwrite)}")


if __name__ == "__main__":
    main()
