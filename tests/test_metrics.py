"""Run outputs: stage boundaries on the curves, JSONL logs cut back on resume, the metrics backends."""

import importlib.util
import json
import os

import pytest

from hljax import metrics as mx


def test_stage_starts_are_where_a_stage_first_appears():
    rows = [{"step": s, "stage": "sft", "loss": 1.0} for s in range(3)] + [
        {"step": s, "stage": "grpo", "loss": 0.5} for s in range(3, 6)]
    assert mx.stage_starts(rows) == [(3, "grpo")]
    assert mx.stage_starts(rows[:3]) == []
    assert mx.stage_starts(list(reversed(rows))) == [(3, "grpo")]  # Order of rows does not matter.


def test_curves_png_is_written_with_a_stage_boundary(tmp_path):
    rows = [{"step": s, "stage": "sft" if s < 4 else "grpo", "loss": 1.0 / (s + 1)} for s in range(8)]
    out = mx.plot_curves(rows, str(tmp_path / "c.png"), title="t")
    assert out and os.path.getsize(out) > 5_000


def test_truncate_jsonl_keeps_rows_up_to_the_resumed_step(tmp_path):
    path = str(tmp_path / "r.jsonl")
    mx.append_jsonl(path, [{"step": s, "x": s} for s in range(5)])
    mx.truncate_jsonl(path, 2)
    with open(path) as f:
        assert [json.loads(line)["step"] for line in f] == [0, 1, 2]
    mx.truncate_jsonl(str(tmp_path / "absent.jsonl"), 2)  # Nothing to cut: no error, no file made.
    assert not os.path.exists(tmp_path / "absent.jsonl")


def test_grpo_metrics_rows_have_the_same_keys_whatever_happened():
    import numpy as np

    from hljax.rl.config import LossConfig
    from hljax.rl.rollout import COL, KINDS, STATS, score_groups

    def stats(kinds, rewards):
        out = np.zeros((len(kinds), len(STATS)))
        out[:, COL["kind"]] = [KINDS.index(k) for k in kinds]
        out[:, COL["reward"]] = rewards
        return out

    clean = score_groups(stats(["ran"] * 4, [0.2, 0.4, 0.6, 0.8]), 4, LossConfig())[2]
    messy = score_groups(stats(["ran", "Unparseable", "NoOp", "crashed"], [0.5, 0.0, 0.0, 0.1]), 4, LossConfig())[2]
    assert set(clean) == set(messy)
    assert clean["invalid/Unparseable"] == 0.0 and messy["invalid/Unparseable"] == 0.25


def test_metrics_backends_name_an_unknown_one_and_a_missing_package(tmp_path):
    from hljax.config import ConfigError
    from hljax.rl.run_config import MetricsSpec

    with pytest.raises(ConfigError, match=r"unknown backend\(s\) \['mlflow'\]"):
        MetricsSpec(backends=("jsonl", "mlflow"))
    with pytest.raises(ConfigError, match="must include 'jsonl'"):
        MetricsSpec(backends=("tensorboard",))
    MetricsSpec(backends=("jsonl", "wandb"))  # Known: whether it is installed is the preflight's business.
    if importlib.util.find_spec("wandb") is None:
        with pytest.raises(ValueError, match=r"the wandb package is not installed: pip install -e '\.\[wandb\]'"):
            mx.check_backends(("jsonl", "wandb"))
        with pytest.raises(ValueError, match="wandb"):
            mx.MetricsWriter(str(tmp_path), backends=("jsonl", "wandb"))


def test_jsonl_only_writes_no_tensorboard_dir(tmp_path):
    w = mx.MetricsWriter(str(tmp_path), backends=("jsonl",))
    w.write(0, {"loss": 1.0})
    w.close()
    assert w.tensorboard is None and sorted(os.listdir(tmp_path)) == ["metrics.jsonl"]
