"""The schema of a collection run (`launch.collect`): the tree of `CollectConfig`
(hljax/data/collect_config.py), every field at its default, where each field's meaning is documented.
Collection configs start from `get_config()` and override fields; the config is locked, so a misspelt
key is an error that names it. Qwen3's thinking mode is off by default for teacher and solver
(`teacher.enable_thinking`, `solver.enable_thinking`)."""

import ml_collections

from hljax.config import config_tree
from hljax.data.collect_config import CollectConfig


def get_config() -> ml_collections.ConfigDict:
    return config_tree(CollectConfig)
