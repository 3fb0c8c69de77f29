"""Test-time adaptation: T revision rounds per task with frozen proposer and solver; only the harness
changes. Each round is persisted, so rerunning the command resumes where it stopped.

    python -m launch.adapt --config configs/adapt_tiny.py

Writes, under run_dir, every round's harness, edit, validity, scores and report, the held-out score
of the harness kept after each round, results tables, a score-vs-round plot and HTML reports.
"""

import logging

from absl import flags
from ml_collections import config_flags

from launch.common import (define_verbose_flag, print_results, run_absl, setup_logging, start_up,
                           stop_on_signals, verbose)

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Adaptation config (configs/adapt_*.py)"
    "; --config.<key>=<value> sets any key of docs/configs.md.", lock_config=True)
define_verbose_flag()


def main(argv):
    del argv
    with start_up(verbose()):
        # Imported once the flags parsed: a flag error comes back without waiting for JAX to load.
        from hljax import preflight
        from hljax.loop.evaluate import run
        from hljax.config import ConfigError
        from hljax.loop.run_config import EvalRunConfig

        cfg = EvalRunConfig.from_config(_CONFIG.value)
        if cfg.evaluation.protocol != "rounds":
            raise ConfigError("launch.adapt runs revision rounds: evaluation.protocol must be 'rounds' "
                              "(use launch.evaluate for the single-revision protocol)")
        checked = preflight.evaluate(cfg)
    setup_logging()
    logging.getLogger(__name__).info("preflight passed: %s", ", ".join(checked))
    with stop_on_signals("stopping after the current round"):  # Each round and held-out score is kept; a rerun resumes.
        summary = run(cfg)
    print_results("adaptation finished", summary)


if __name__ == "__main__":
    flags.mark_flags_as_required(["config"])
    run_absl(main)
