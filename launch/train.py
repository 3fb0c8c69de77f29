"""Train the proposer: SFT, GRPO, or SFT then GRPO, as the config says.

    python -m launch.train --config configs/tiny.py [--config.grpo.steps=10 ...]

The same command runs on every host of a TPU pod or GPU cluster (set distributed.initialize=True, or
the JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID variables; docs/scaling.md).
Rerunning it on a run_dir with checkpoints resumes from the latest one; SIGTERM or Ctrl-C
checkpoints after the current step and exits (143 or 130), a second Ctrl-C quits at once. Bad inputs (config, model
folders, servers, data files, run_dir, disk, sandbox) are one line on stderr and exit 2 within seconds,
before any model loads (hljax/preflight.py); --verbose shows tracebacks.
"""

import logging
import sys

from absl import flags
from ml_collections import config_flags

from launch.common import define_verbose_flag, run_absl, setup_logging, start_up, verbose

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config file (configs/*.py)"
    "; --config.<key>=<value> sets any key of docs/configs.md.", lock_config=True)
define_verbose_flag()


def main(argv):
    del argv
    with start_up(verbose()):
        # Imported once the flags parsed: a flag error comes back without waiting for JAX to load.
        from hljax import distributed as dist
        from hljax import preflight
        from hljax.rl.run_config import RunConfig

        cfg = RunConfig.from_config(_CONFIG.value)
        checked = preflight.train(cfg)  # Touches no JAX device: distributed.initialize comes next.
    multi = dist.initialize(cfg.distributed)  # First, before any JAX device exists.
    # Imported after initialize, so that nothing it imports can touch a JAX device first.
    from hljax.rl.trainer import Preempted, Trainer

    tag = f"[p{dist.process_index()}/{dist.process_count()}] " if multi else ""
    setup_logging(tag)
    logging.getLogger(__name__).info("preflight passed: %s", ", ".join(checked))
    try:
        summary = Trainer(cfg).run()
    except Preempted as e:
        print(f"\n== stopped == {tag}{e}", flush=True)
        sys.exit(e.exit_code)  # 143 (SIGTERM): schedulers requeue, and the rerun resumes; 130 for Ctrl-C.
    except KeyboardInterrupt:
        print(f"\n== interrupted == {tag}a second Ctrl-C: quit without saving the current step", flush=True)
        sys.exit(130)
    if not dist.is_main():
        return
    print("\n== run finished ==")
    for key, value in summary.items():
        print(f"{key:>20}: {value}")


if __name__ == "__main__":
    flags.mark_flags_as_required(["config"])
    run_absl(main)
