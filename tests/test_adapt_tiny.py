"""launch.adapt and launch.evaluate with the tiny model on the embedded engine, as a user runs them."""

import csv
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from hljax.loop import records as rec
from hljax.checkpoint.presets import init_model
from hljax.tasks.reasoning_gym import ReasoningGymTask, RGTaskConfig
from hljax.tasks.suite import split_config
from sandbox.isolation import bwrap_path as _bwrap_path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(_bwrap_path() is None, reason="bwrap not installed: the sandbox refuses")]
FAMILY = "aiw"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return init_model("tiny", str(tmp_path_factory.mktemp("tiny")), seed=1)


def _argv(module, config, run_dir, *overrides):
    return [sys.executable, "-m", module, "--config", os.path.join(ROOT, config), f"--config.run_dir={run_dir}",
            f"--config.tasks.families=('{FAMILY}',)", *overrides]


def _env():
    return {**os.environ, "XLA_FLAGS": "", "PYTHONPATH": ROOT}


def _run(argv, timeout=600):
    out = subprocess.run(argv, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    return out.stdout


def _rounds(run_dir, label="tiny"):
    return rec.RunStore(os.path.join(run_dir, label, f"rg_{FAMILY}", "run0")).rounds()


def _comparable(rounds):
    return [(r.round, r.parent, r.report, [(c.id, c.completion, c.kind, c.score) for c in r.candidates], r.selected)
            for r in rounds]


def test_adaptation_killed_after_round_2_resumes_like_an_uninterrupted_run(model, tmp_path):
    overrides = [f"--config.proposers=('tiny={model}',)", "--config.adapt.rounds=4", "--config.report.html=False"]
    full = str(tmp_path / "full")
    _run(_argv("launch.adapt", "configs/adapt_tiny.py", full, *overrides))

    cut = str(tmp_path / "cut")
    proc = subprocess.Popen(_argv("launch.adapt", "configs/adapt_tiny.py", cut, *overrides), cwd=ROOT, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while len(_safe_rounds(cut)) < 2:
            assert proc.poll() is None, "the run ended before it could be interrupted"
            assert time.monotonic() < deadline
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert 2 <= len(_safe_rounds(cut)) < 4
    _run(_argv("launch.adapt", "configs/adapt_tiny.py", cut, *overrides))

    a, b = _rounds(full), _rounds(cut)
    assert len(a) == len(b) == 4
    assert _comparable(a) == _comparable(b)
    assert all(len(r.candidates) == 2 for r in a)


def _safe_rounds(run_dir):
    try:
        return _rounds(run_dir)
    except (FileNotFoundError, json.JSONDecodeError):
        return []


def test_single_revision_evaluation_tables_report_and_disjoint_questions(model, tmp_path):
    run_dir = str(tmp_path / "eval")
    out = _run(_argv("launch.evaluate", "configs/adapt_tiny.py", run_dir, "--config.evaluation.protocol=single",
                     "--config.adapt.proposals=4", f"--config.proposers=('base={model}', 'rl={model}')"))
    assert "Oracle best-of-N" in out

    with open(os.path.join(run_dir, "results.csv")) as f:
        rows = list(csv.DictReader(f))
    assert [r["proposer"] for r in rows] == ["seed", "base", "rl"]
    for r in rows[1:]:
        assert float(r["oracle"]) >= float(r["mean"])
        assert int(r["proposals"]) == 4
    md = open(os.path.join(run_dir, "results.md")).read()
    assert md.index("| seed |") < md.index("| base |") < md.index("| rl |")

    # Held-out questions are exactly the task's eval split, and never fed back or scored on.
    task = ReasoningGymTask(RGTaskConfig(family=FAMILY, generator_seed=0, pool_size=2000,
                                         splits=split_config(3, 64, 64, 0)))
    expected_eval = [q.qid for q in task.take("eval", 6)]
    for label in ("base", "rl"):
        directory = os.path.join(run_dir, label, f"rg_{FAMILY}", "single")
        held = json.load(open(os.path.join(directory, "eval.json")))["qids"]
        assert held == expected_eval
        (r,) = rec.RunStore(directory).rounds()
        assert set(r.feedback_qids) == {q.qid for q in task.feedback_round(0)}
        assert not set(held) & set(r.feedback_qids)
        assert not set(held) & {q.qid for q in task.take("scoring", 64)}
        assert len(r.candidates) == 4
        page = open(os.path.join(directory, "report.html")).read()
        assert page.count('class="node') >= 1 + 4
    index = open(os.path.join(run_dir, "index.html")).read()
    assert "base" in index and "rl" in index
