"""The schema of test-time adaptation and evaluation runs (`launch.adapt`, `launch.evaluate`): the
tree of `EvalRunConfig` (hljax/loop/run_config.py), every field at its default, where each field's
meaning is documented. Experiment configs start from `get_config()` and override fields; the config
is locked, so a misspelt key is an error that names it. `proposers` is required. Qwen3's thinking mode
is off by default for proposers and solver (`proposer.enable_thinking`, `solver.enable_thinking`)."""

import ml_collections

from hljax.config import config_tree
from hljax.loop.run_config import EvalRunConfig


def get_config() -> ml_collections.ConfigDict:
    return config_tree(EvalRunConfig)
