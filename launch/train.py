"""Train the proposer: SFT, GRPO, or SFT then GRPO, as the config says.

    python -m launch.train --config configs/tiny.py [--config.grpo.steps=10 ...]

The same command runs on every host of a TPU pod or GPU cluster (set distributed.initialize=True).
Rerunning it on a run_dir with checkpoints resumes from the latest one.
"""

import logging
import sys

from absl import app, flags
from ml_collections import config_flags

from hljax.rl.run_config import RunConfig
from hljax.rl.trainer import Preempted, Trainer

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file (configs/*.py).", lock_config=True)


def main(argv):
    del argv
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("absl", "jax", "orbax", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    cfg = RunConfig.from_config(_CONFIG.value)
    try:
        summary = Trainer(cfg).run()
    except Preempted as e:
        print(f"\n== preempted == {e}", flush=True)
        sys.exit(143)  # 128 + SIGTERM: schedulers requeue, and the rerun resumes.
    print("\n== run finished ==")
    for key, value in summary.items():
        print(f"{key:>20}: {value}")


if __name__ == "__main__":
    flags.mark_flags_as_required(["config"])
    app.run(main)
