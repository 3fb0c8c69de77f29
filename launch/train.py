"""Train the proposer: SFT, GRPO, or SFT then GRPO, as the config says.

    python -m launch.train --config configs/tiny.py [--config.grpo.steps=10 ...]

The same command runs on every host of a TPU pod or GPU cluster (set distributed.initialize=True, or
the JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID variables; docs/scaling.md).
Rerunning it on a run_dir with checkpoints resumes from the latest one that restores (a newer, damaged
one is named in a warning and renamed <step>.damaged; torn last lines of its JSONL files are cut);
SIGTERM or Ctrl-C checkpoints after the current step and exits (143 or 130), a second Ctrl-C quits at once. Bad inputs (config, model
folders, servers, data files, run_dir, disk, sandbox) are one line on stderr and exit 2 within seconds,
before any model loads (hljax/preflight.py); --verbose shows tracebacks.
"""

import logging
import os

from absl import flags
from ml_collections import config_flags

from launch.common import (config_source, define_verbose_flag, devices, exit_on_stop, fail, print_banner,
                           print_summary, run_absl, sandbox, setup_logging, solver, start_up, verbose)

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config file (configs/*.py)"
    "; --config.<key>=<value> sets any key of docs/configs.md.", lock_config=True)
define_verbose_flag()


def main(argv):
    del argv
    with start_up(verbose()):
        # Imported once the flags parsed: a flag error comes back without waiting for JAX to load.
        from hljax import distributed as dist
        from hljax import preflight, xla_options
        from hljax.rl.run_config import RunConfig

        cfg = RunConfig.from_config(_CONFIG.value)
        checked = preflight.train(cfg)  # Touches no JAX device: distributed.initialize comes next.
    xla_options.for_remat(cfg.model.remat)  # XLA reads its flags when the first device is made.
    multi = dist.initialize(cfg.distributed)  # First, before any JAX device exists.
    # Imported after initialize, so that nothing it imports can touch a JAX device first.
    from hljax.rl.trainer import Trainer

    tag = f"[p{dist.process_index()}/{dist.process_count()}] " if multi else ""
    setup_logging(tag)
    logging.getLogger(__name__).info("preflight passed: %s", ", ".join(checked))
    if dist.is_main():
        resuming = preflight.checkpoint_steps(os.path.join(cfg.run_dir, "checkpoints"))
        total = cfg.sft_steps + cfg.grpo_steps
        stages = [f"{name} {n} steps" for name, n in (("SFT", cfg.sft_steps), ("GRPO", cfg.grpo_steps)) if n]
        print_banner({
            "config": config_source(),
            "run_dir": cfg.run_dir + (" (new run)" if not resuming else
                                      f" (complete: all {total} steps done; outputs refreshed)" if resuming[-1] >= total - 1
                                      else f" (checkpoints up to step {resuming[-1]}: resumes from the newest one that reads)"),
            "stages": ", then ".join(stages),
            "devices": devices(),
            **({"sandbox": sandbox(cfg.sandbox), "solver": solver(cfg.solver)} if cfg.grpo_steps else {}),
        })
    from hljax.checkpoint.orbax import CheckpointUnreadable
    from hljax.checkpoint.owner import OutputExists

    with exit_on_stop(tag):  # The trainer's own handlers checkpoint after the current step.
        try:
            summary = Trainer(cfg).run()
        except (OutputExists, CheckpointUnreadable) as e:  # Refused before the first step: one line.
            if verbose():
                raise
            fail(str(e))
    if not dist.is_main():
        return
    outputs = summary.pop("outputs")
    print_summary("run finished", summary, outputs)


if __name__ == "__main__":
    flags.mark_flags_as_required(["config"])
    run_absl(main)
