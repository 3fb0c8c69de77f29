"""A run dir remembers its config (hljax.config.RERUN_CHANGES): a rerun that would change what the
run computes is refused at start-up, naming each key with its old and new value; a rerun that only
extends the run (more steps, rounds, proposers) or moves it (servers, devices, logging) is allowed."""

import json
import os
import subprocess
import sys
import time

import pytest

from configs import adapt_tiny, tiny
from hljax import config as hc
from hljax import preflight
from hljax.config import ConfigError
from hljax.loop.run_config import EvalRunConfig
from hljax.rl.run_config import RunConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _train_cfg(run_dir, **overrides) -> RunConfig:
    c = tiny.get_config()
    c.run_dir = str(run_dir)
    for key, value in overrides.items():
        block, _, name = key.rpartition("__")
        setattr(c[block] if block else c, name, value)
    return RunConfig.from_config(c)


def _saved(run_dir, **overrides) -> str:
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, "config.json")
    hc.save_config(path, _train_cfg(run_dir, **overrides))
    return path


def test_a_change_of_model_is_refused_naming_key_and_values(tmp_path):
    path = _saved(tmp_path)
    before = open(path).read()
    cfg = _train_cfg(tmp_path, model__preset="tiny-qwen3.5", loss__beta=0.04)
    with pytest.raises(ConfigError) as e:
        hc.check_rerun(path, cfg, "train")
    message = str(e.value)
    assert "model.preset 'tiny' -> 'tiny-qwen3.5'" in message
    assert "loss.beta 0.0 -> 0.04" in message
    assert "--config.run_dir=" in message and path in message
    assert open(path).read() == before  # Nothing rewritten.


def test_extensions_and_moves_are_allowed(tmp_path):
    path = _saved(tmp_path)
    cfg = _train_cfg(tmp_path, grpo__steps=40, checkpoint__every=5, solver__max_batch=4)
    changes = {c.key: (c.old, c.new) for c in hc.check_rerun(path, cfg, "train")}
    assert changes == {"grpo.steps": (20, 40), "checkpoint.every": (50, 5), "solver.max_batch": (16, 4)}
    assert hc.check_rerun(path, _train_cfg(tmp_path), "train") == []  # The same config: nothing to say.


def test_fewer_steps_and_flat_solver_keys_are_refused_by_their_config_key(tmp_path):
    path = _saved(tmp_path)
    with pytest.raises(ConfigError, match=r"grpo\.steps 20 -> 10"):
        hc.check_rerun(path, _train_cfg(tmp_path, grpo__steps=10), "train")
    with pytest.raises(ConfigError, match=r"solver\.temperature 0\.0 -> 0\.7"):  # The solver budget's flat key.
        hc.check_rerun(path, _train_cfg(tmp_path, solver__temperature=0.7), "train")


def test_a_field_newer_than_the_run_counts_as_its_default(tmp_path):
    path = _saved(tmp_path)
    with open(path) as f:
        saved = json.load(f)
    del saved["loss"]["beta"], saved["metrics"]
    saved["a_removed_field"] = 1
    with open(path, "w") as f:
        json.dump(saved, f)
    assert hc.check_rerun(path, _train_cfg(tmp_path), "train") == []
    with pytest.raises(ConfigError, match=r"loss\.beta 0\.0 -> 0\.1"):
        hc.check_rerun(path, _train_cfg(tmp_path, loss__beta=0.1), "train")


def test_more_sft_steps_are_refused_once_grpo_has_begun(tmp_path):
    _saved(tmp_path)
    more = _train_cfg(tmp_path, sft__steps=250)
    preflight.check_train_rerun(more)  # No checkpoint yet: SFT simply goes on longer.
    os.makedirs(tmp_path / "checkpoints" / "205")
    with pytest.raises(ConfigError, match=r"sft\.steps 200 -> 250 would renumber"):
        preflight.check_train_rerun(more)


def test_evaluation_may_grow_rounds_and_proposers(tmp_path):
    c = adapt_tiny.get_config()
    c.run_dir = str(tmp_path)
    c.proposers = ("a=/models/a",)
    path = str(tmp_path / "config.json")
    hc.save_config(path, EvalRunConfig.from_config(c))
    c.proposers = ("a=/models/a", "b=/models/b")
    c.adapt.rounds += 2
    keys = [ch.key for ch in hc.check_rerun(path, EvalRunConfig.from_config(c), "evaluate")]
    assert sorted(keys) == ["adapt.rounds", "proposers"]
    c.proposers = ("b=/models/b",)  # Row "a" dropped: its files no longer match the table.
    with pytest.raises(ConfigError, match="proposers"):
        hc.check_rerun(path, EvalRunConfig.from_config(c), "evaluate")


def test_every_allowed_key_is_a_config_key():
    """RERUN_CHANGES names keys of the schema (a typo would silently refuse what it meant to allow)."""
    from hljax.data.collect_config import CollectConfig

    for kind, cls in (("train", RunConfig), ("evaluate", EvalRunConfig), ("collect", CollectConfig)):
        keys = set(hc._flatten(cls, hc._default_json(cls)))
        for key in hc.RERUN_CHANGES[kind]:
            assert any(k == key or (key.endswith(".") and k.startswith(key)) for k in keys), (kind, key)


def test_launch_train_refuses_within_seconds(tmp_path):
    """The README's Qwen3.5 sentence run on the quick start's finished dir: one line, exit 2, before
    any model loads; config.json is left as it was."""
    path = _saved(tmp_path / "run")
    before = open(path).read()
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "launch.train", "--config", "configs/tiny.py",
                           f"--config.run_dir={tmp_path / 'run'}", "--config.model.preset=tiny-qwen3.5"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - start
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and "model.preset 'tiny' -> 'tiny-qwen3.5'" in lines[0], proc.stderr
    assert "--config.run_dir=" in lines[0]
    assert open(path).read() == before
    assert elapsed < 20, elapsed
