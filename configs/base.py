"""The schema of a training run: the tree of `RunConfig` (hljax/rl/run_config.py), every field at
its default, where each field's meaning is documented. Experiment configs start from `get_config()`
and override fields; the config is locked, so a misspelt key is an error that names it
(`--config.los.beta=...`). Qwen3's thinking mode is off by default for proposer and solver
(`model.enable_thinking`, `solver.enable_thinking`): prompts end with the template's empty think block."""

import ml_collections

from hljax.config import config_tree
from hljax.rl.run_config import RunConfig


def get_config() -> ml_collections.ConfigDict:
    return config_tree(RunConfig)
