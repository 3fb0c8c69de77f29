"""What the launchers print: the end-of-run summary lists only outputs that exist, and library logs
stay at WARNING."""

import logging

from launch import common


def test_the_summary_lists_only_outputs_that_exist(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    (tmp_path / "tensorboard").mkdir()
    outputs = {"metrics": str(tmp_path / "metrics.jsonl"), "tensorboard": str(tmp_path / "tensorboard"),
               "kept rows": str(tmp_path / "never-written.jsonl"), "plot": ""}
    common.print_summary("run finished", {"edit validity after sft": 1.0}, outputs, table="task  kept")
    out = capsys.readouterr().out
    assert "== run finished ==" in out and "task  kept" in out
    assert "edit validity after sft: 1.0" in out  # tests/test_train_e2e.py looks for this form.
    assert f"tensorboard: {tmp_path / 'tensorboard'}" in out and "metrics.jsonl" in out
    assert "never-written" not in out and "plot" not in out


def test_library_logs_are_kept_at_warning():
    common.setup_logging()
    for name in ("absl", "jax", "orbax", "httpx", "urllib3"):
        assert logging.getLogger(name).getEffectiveLevel() == logging.WARNING, name
