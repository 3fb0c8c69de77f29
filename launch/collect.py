"""Collect SFT data: a teacher's revisions of the seed harness, scored in the sandbox and filtered.

    python -m launch.collect --config configs/collect_rg.py --config.teacher.url=http://HOST:PORT ...

Rerunning the same command resumes: rows already written are skipped (see hljax/data/collect.py).
"""

from absl import app, flags
from ml_collections import config_flags

from hljax.data.collect import CollectConfig, Collector, format_summary
from launch.common import setup_logging

_CONFIG = config_flags.DEFINE_config_file("config", None, "Collector config file (configs/collect_*.py).",
                                          lock_config=True)


def main(argv):
    del argv
    setup_logging()
    cfg = CollectConfig.from_config(_CONFIG.value)
    with Collector(cfg) as collector:
        summary = collector.run()
    print("\n== collection finished ==")
    print(format_summary(summary))
    print(f"\nkept rows: {cfg.out}\nrejected rows: {cfg.rejected_path}\nsummary: {cfg.stem}.summary.json")


if __name__ == "__main__":
    flags.mark_flags_as_required(["config"])
    app.run(main)
