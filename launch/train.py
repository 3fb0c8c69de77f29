"""Train the proposer: SFT, GRPO, or SFT then GRPO, as the config says.

    python -m launch.train --config configs/tiny.py [--config.grpo.steps=10 ...]

The same command runs on every host of a TPU pod or GPU cluster (set distributed.initialize=True, or
the JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID variables; docs/scaling.md).
Rerunning it on a run_dir with checkpoints resumes from the latest one.
"""

import sys

from absl import app, flags
from ml_collections import config_flags

from hljax import distributed as dist
from hljax.rl.run_config import RunConfig
from launch.common import setup_logging

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file (configs/*.py).", lock_config=True)


def main(argv):
    del argv
    cfg = RunConfig.from_config(_CONFIG.value)
    multi = dist.initialize(cfg.distributed)  # First, before any JAX device exists.
    # Imported after initialize, so that nothing it imports can touch a JAX device first.
    from hljax.rl.trainer import Preempted, Trainer

    tag = f"[p{dist.process_index()}/{dist.process_count()}] " if multi else ""
    setup_logging(tag)
    try:
        summary = Trainer(cfg).run()
    except Preempted as e:
        print(f"\n== preempted == {tag}{e}", flush=True)
        sys.exit(143)  # 128 + SIGTERM: schedulers requeue, and the rerun resumes.
    if not dist.is_main():
        return
    print("\n== run finished ==")
    for key, value in summary.items():
        print(f"{key:>20}: {value}")


if __name__ == "__main__":
    flags.mark_flags_as_required(["config"])
    app.run(main)
