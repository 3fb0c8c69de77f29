"""Evaluate frozen proposers with the paper's protocols; tables (Markdown, CSV), plots and HTML reports.

    python -m launch.evaluate --config configs/eval_rg_single.py --config.proposers='("rl=runs/rg_grpo/export",)'

Rerunning the command on the same run_dir reuses what is done and finishes the rest.
"""

import logging

from absl import app, flags
from ml_collections import config_flags

from hljax.loop.evaluate import run
from hljax.loop.run_config import EvalRunConfig

_CONFIG = config_flags.DEFINE_config_file("config", None, "Evaluation config (configs/eval_*.py, adapt_*.py).",
                                          lock_config=True)


def main(argv):
    del argv
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("absl", "jax", "orbax", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    summary = run(EvalRunConfig.from_config(_CONFIG.value))
    if summary:
        print("\n== evaluation finished ==")
        with open(summary["results_md"]) as f:
            print(f.read())
        for key, value in summary.items():
            print(f"{key:>12}: {value}")


if __name__ == "__main__":
    flags.mark_flags_as_required(["config"])
    app.run(main)
