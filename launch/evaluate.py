"""Evaluate frozen proposers with the paper's protocols; tables (Markdown, CSV), plots and HTML reports.

    python -m launch.evaluate --config configs/eval_rg_single.py --config.proposers='("rl=runs/rg_grpo/export",)'

Rerunning the command on the same run_dir reuses what is done and finishes the rest.
"""

import logging

from absl import flags
from ml_collections import config_flags

from launch.common import (define_verbose_flag, print_results, run_absl, setup_logging, start_up,
                           stop_on_signals, verbose)

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Evaluation config (configs/eval_*.py, adapt_*.py)"
    "; --config.<key>=<value> sets any key of docs/configs.md.", lock_config=True)
define_verbose_flag()


def main(argv):
    del argv
    with start_up(verbose()):
        # Imported once the flags parsed: a flag error comes back without waiting for JAX to load.
        from hljax import preflight
        from hljax.loop.evaluate import run
        from hljax.loop.run_config import EvalRunConfig

        cfg = EvalRunConfig.from_config(_CONFIG.value)
        checked = preflight.evaluate(cfg)
    setup_logging()
    logging.getLogger(__name__).info("preflight passed: %s", ", ".join(checked))
    with stop_on_signals("stopping after the current round or task"):  # Each round and held-out score is kept; a rerun resumes.
        summary = run(cfg)
    print_results("evaluation finished", summary)


if __name__ == "__main__":
    flags.mark_flags_as_required(["config"])
    run_absl(main)
