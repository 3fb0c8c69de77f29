"""Every config file in configs/ parses into its typed config (required paths given dummy values);
the list comes from the folder, so a new config is covered the moment it is added."""

import glob
import importlib
import os

import pytest

from hljax.data.collect import CollectConfig
from hljax.loop.run_config import EvalRunConfig
from hljax.rl.run_config import ConfigError, RunConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOT_RUN_CONFIGS = {"__init__", "rg_families"}  # The family lists, not a run.
NAMES = sorted(os.path.splitext(os.path.basename(p))[0] for p in glob.glob(os.path.join(ROOT, "configs", "*.py")))


def _kind(c) -> str:
    if "proposers" in c:
        return "eval"
    if "teacher" in c:
        return "collect"
    return "train"


def _fill_required(c, kind: str):
    """Dummy values for the fields a shipped config leaves to the user."""
    if kind == "eval" and not c.proposers:
        c.proposers = ("rl=/models/rl",)
    if kind == "train" and not c.model.path and not c.model.preset:
        c.model.path = "/models/proposer"
    if kind == "train" and c.tasks.suite == "multihop_qa" and not c.tasks.qa_files:
        c.tasks.qa_files = ("hotpotqa:/data/hotpot_train_v1.1.json",)
    if c.solver.backend == "sglang":
        c.solver.path = c.solver.path or "/models/solver"
        c.solver.url = c.solver.url or "http://127.0.0.1:30000"
    return c


@pytest.mark.parametrize("name", [n for n in NAMES if n not in NOT_RUN_CONFIGS])
def test_every_config_parses(name):
    c = importlib.import_module(f"configs.{name}").get_config()
    kind = _kind(c)
    c = _fill_required(c, kind)
    if kind == "eval":
        cfg = EvalRunConfig.from_config(c)
    elif kind == "collect":
        if c.teacher.backend == "remote":
            c.teacher.url = c.teacher.url or "http://127.0.0.1:30001"
            c.teacher.model = c.teacher.model or "teacher"
            c.teacher.path = c.teacher.path or "/models/teacher"
        cfg = CollectConfig.from_config(c)
    else:
        try:
            cfg = RunConfig.from_config(c)
        except ConfigError as e:
            pytest.fail(f"configs/{name}.py does not parse with dummy required paths: {e}")
    assert cfg is not None


def test_a_string_for_a_tuple_field_names_the_key():
    """`--config.tasks.qa_files=(1` reaches the schema as the string "(1"."""
    from hljax.rl.run_config import TaskSpec, typed

    with pytest.raises(ConfigError, match=r"tasks\.qa_files='\(1' must be a tuple"):
        typed(TaskSpec, {"qa_files": "(1"}, "config.tasks")
