"""Collect SFT data: a teacher's revisions of the seed harness, scored in the sandbox and filtered.

    python -m launch.collect --config configs/collect_rg.py --config.teacher.url=http://HOST:PORT ...

Rerunning the same command resumes: rows already written are skipped (see hljax/data/collect.py).
"""

import logging

from absl import flags
from ml_collections import config_flags

from launch.common import (define_verbose_flag, print_summary, run_absl, setup_logging, start_up, stop_on_signals,
                           verbose)

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Collector config file (configs/collect_*.py)"
    "; --config.<key>=<value> sets any key of docs/configs.md.", lock_config=True)
define_verbose_flag()


def main(argv):
    del argv
    with start_up(verbose()):
        # Imported once the flags parsed: a flag error comes back without waiting for JAX to load.
        from hljax import preflight
        from hljax.data.collect import Collector, format_summary
        from hljax.data.collect_config import CollectConfig

        cfg = CollectConfig.from_config(_CONFIG.value)
        checked = preflight.collect(cfg)
    setup_logging()
    logging.getLogger(__name__).info("preflight passed: %s", ", ".join(checked))
    with stop_on_signals("stopping after the current state's proposals"), Collector(cfg) as collector:
        summary = collector.run()  # Rows are written one at a time; a rerun skips them.
    # A collection that kept nothing wrote no kept-rows file: only what exists is listed.
    print_summary("collection finished", {}, {"kept rows": cfg.out, "rejected rows": cfg.rejected_path,
                                              "summary": f"{cfg.stem}.summary.json",
                                              "config": f"{cfg.stem}.config.json"}, table=format_summary(summary))


if __name__ == "__main__":
    flags.mark_flags_as_required(["config"])
    run_absl(main)
