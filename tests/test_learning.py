"""Issue 33's learning regression test: the RL proposer of configs/learning.py reads the execution report.

Each family has its own weaknesses of the simulated solver, seen only in the report
(hljax/tasks/bottlenecks.py), and SFT chose fixes without regard to them, so a proposer can only tie
a report's symptom to its fix through GRPO's reward. The test trains configs/learning.py (seed 0:
the 4-layer tiny proposer, SFT of 1,000 steps on generated rows (every fix per harness), 120 GRPO steps
on revision chains of the 5 RL families; about 30 min on 2 idle cores), then asks the RL proposer for single-step edits on
the 21 held-out families (never seen in GRPO) with the report and with an empty one: with the report
it must score more, by REPORT_MARGIN.

Too long for CI's 45 minutes, so it runs on request: `HLJAX_LEARNING=1 scripts/test.sh -m learning`.
`HLJAX_LEARNING_RUN=<run dir>` evaluates a finished run instead of training one (a run of
`python -m launch.train --config configs/learning.py`, or bench/learning.py's `train-seed0`).
Mutation check (issue 33's closing note): a run whose GRPO saw a constant report
(`--config.mode=grpo --config.model.path=<its export-sft> --config.prompt.report=empty`) fails it.
"""

import csv
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = os.environ.get("HLJAX_LEARNING_RUN")
# bench/learning.py at temperature 0.1, held out, single step (2026-12-06, configs/learning.py): the RL
# proposer beat itself given an empty report by 0.142, 0.049 and 0.072 in seeds 0, 1, 2 (40 GRPO steps on
# seed harnesses: 0.175, 0.094, 0.054). Blind mutants (GRPO from seed 0's SFT checkpoint on a constant
# report) came out +0.025 (GRPO at 2e-4, which the earlier margin of 0.02 let pass) and +0.013 (40 steps
# at 1e-3 on seed harnesses); the live-chain recipe's collapsed (0.000 either way). The recipe adopted
# 2026-12-07 (every fix per SFT harness, seeds 6, 7, 8): 0.100, 0.122, 0.138.
REPORT_MARGIN = 0.05
TEMPERATURE = 0.1  # bench/learning.py's evaluation temperature (chosen on the RL families).

pytestmark = [pytest.mark.learning, pytest.mark.timeout(4 * 3600),
              pytest.mark.skipif(os.environ.get("HLJAX_LEARNING") != "1" and not RUN,
                                 reason="about 30 min: HLJAX_LEARNING=1 (or HLJAX_LEARNING_RUN=<run dir>) runs it")]


def _run(argv, timeout):
    out = subprocess.run([sys.executable, *argv], cwd=ROOT, env={**os.environ, "XLA_FLAGS": "", "PYTHONPATH": ROOT},
                         capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"{argv}: exit {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-5000:]}")
    return out.stdout + out.stderr


@pytest.fixture(scope="module")
def learning_run(tmp_path_factory):
    if RUN:
        assert os.path.exists(os.path.join(RUN, "export", "config.json")), f"HLJAX_LEARNING_RUN={RUN} has no export/"
        return RUN
    tmp = tmp_path_factory.mktemp("learning")
    data, run = str(tmp / "sft.jsonl"), str(tmp / "run")
    _run(["scripts/make_sft_tiny.py", "--rounds", "80", "--seed", "1", "--fixes", "all", "--seed-share", "0.4",
          "--default-names-share", "0.5", "--out", data], timeout=900)  # configs/learning.py's rows.
    _run(["-m", "launch.train", "--config", "configs/learning.py", "--config.seed=0", f"--config.run_dir={run}",
          f"--config.sft.data={data}"], timeout=3 * 3600)
    return run


def _held_out_single_step(run, out, report):
    """The RL export's single-step protocol on the 21 held-out families (8 proposals from the seed
    harness, each scored on 16 held-out questions): the mean over families and proposals."""
    _run(["-m", "launch.evaluate", "--config", "configs/adapt_tiny.py", f"--config.run_dir={out}",
          f"--config.proposers=('rl={run}/export',)", "--config.tasks.role=heldout", "--config.tasks.families=()",
          "--config.proposer.max_seq_len=4096", "--config.evaluation.protocol=single", "--config.adapt.proposals=8",
          "--config.evaluation.eval_questions=16", "--config.adapt.scoring_questions=8",
          f"--config.adapt.temperature={TEMPERATURE}", "--config.adapt.max_new_tokens=256",
          f"--config.prompt.report={report}", "--config.report.html=False", "--config.report.plots=False"],
         timeout=1800)
    with open(os.path.join(out, "results.csv")) as f:
        rows = [r for r in csv.DictReader(f) if r["proposer"] == "rl"]
    assert len(rows) == 21, rows
    return float(np.mean([float(r["mean"]) for r in rows]))


def test_the_rl_proposer_reads_the_report(learning_run, tmp_path):
    full = _held_out_single_step(learning_run, str(tmp_path / "full"), "full")
    empty = _held_out_single_step(learning_run, str(tmp_path / "empty"), "empty")
    print(f"RL proposer, single step on the held-out families: report {full:.3f}, empty report {empty:.3f}")
    assert full > empty + REPORT_MARGIN, (full, empty)
