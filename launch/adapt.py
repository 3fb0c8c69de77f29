"""Test-time adaptation: T revision rounds per task with frozen proposer and solver; only the harness
changes. Each round is persisted, so rerunning the command resumes where it stopped.

    python -m launch.adapt --config configs/adapt_tiny.py

Writes, under run_dir, every round's harness, edit, validity, scores and report, the held-out score
of the harness kept after each round, results tables, a score-vs-round plot and HTML reports.
"""

from absl import app, flags
from ml_collections import config_flags

from hljax.loop.evaluate import run
from hljax.loop.run_config import ConfigError, EvalRunConfig
from launch.common import print_results, setup_logging

_CONFIG = config_flags.DEFINE_config_file("config", None, "Adaptation config (configs/adapt_*.py).",
                                          lock_config=True)


def main(argv):
    del argv
    setup_logging()
    cfg = EvalRunConfig.from_config(_CONFIG.value)
    if cfg.evaluation.protocol != "rounds":
        raise ConfigError("launch.adapt runs revision rounds: evaluation.protocol must be 'rounds' "
                          "(use launch.evaluate for the single-revision protocol)")
    summary = run(cfg)
    print_results("adaptation finished", summary)


if __name__ == "__main__":
    flags.mark_flags_as_required(["config"])
    app.run(main)
