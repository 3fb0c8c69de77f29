"""Evaluate frozen proposers with the paper's protocols; tables (Markdown, CSV), plots and HTML reports.

    python -m launch.evaluate --config configs/eval_rg_single.py --config.proposers='("rl=runs/rg_grpo/export",)'

Rerunning the command on the same run_dir reuses what is done and finishes the rest.
"""

from absl import app, flags
from ml_collections import config_flags

from hljax.loop.evaluate import run
from hljax.loop.run_config import EvalRunConfig
from launch.common import print_results, setup_logging

_CONFIG = config_flags.DEFINE_config_file("config", None, "Evaluation config (configs/eval_*.py, adapt_*.py).",
                                          lock_config=True)


def main(argv):
    del argv
    setup_logging()
    summary = run(EvalRunConfig.from_config(_CONFIG.value))
    print_results("evaluation finished", summary)


if __name__ == "__main__":
    flags.mark_flags_as_required(["config"])
    app.run(main)
