"""Harness learning, end to end: a short GRPO run with the simulated solver raises the mean
scoring-set score of the sampled candidates.

The proposer is first taught, by SFT, three generic edits of the seed harness in equal shares: one
helpful (insist on the answer format), one neutral (greedy decoding) and one harmful (ask for plain
text). GRPO must then shift it towards the helpful one from the reward alone. This is the test that
fails if the learning signal is broken anywhere between the sandbox's scores and the proposer's
weights: a sign flip between rewards and advantages, a weight sync that leaves the rollout server on
old weights, scoring questions that do not match the candidates.
"""

import json
import os
import statistics

import pytest

from configs import tiny
from hljax.rl.run_config import RunConfig
from sandbox.isolation import bwrap_path as _bwrap_path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(_bwrap_path() is None, reason="bwrap not found: the sandbox refuses to start")]

EDITS = {  # The notes of data/sft_tiny.jsonl's edits this test trains on, by kind.
    "helpful": "Remind the solver to answer only in the requested format.",
    "neutral": "Use greedy decoding so the answer is stable.",
    "harmful": "Ask for a plain-text answer without formatting.",
}
GRPO_STEPS = 12


def _sft_rows(path):
    with open(os.path.join(ROOT, "data", "sft_tiny.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    kept = [r for r in rows if r["completion"].split("\n", 1)[0] in EDITS.values()]
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in kept)
    return len(kept)


def test_grpo_with_the_simulated_solver_raises_the_candidates_score(tmp_path):
    from hljax.rl.trainer import Trainer

    data = str(tmp_path / "sft.jsonl")
    assert _sft_rows(data) >= 12
    c = tiny.get_config()
    c.run_dir = str(tmp_path / "run")
    c.sft.data = data
    c.sft.steps = 60
    c.sft.eval_rows = 0
    c.grpo.steps = GRPO_STEPS
    # The same scoring questions at every step, so a step's mean score moves only with the edits sampled.
    c.grpo.scoring_windows = 1
    c.grpo.max_new_tokens = 96
    c.optim.learning_rate = 1e-3
    c.checkpoint.every = 1000
    c.log.plots = False
    c.log.tensorboard = False
    c.export.at_end = False
    cfg = RunConfig.from_config(c)
    assert cfg.solver.simulated
    Trainer(cfg).run()

    with open(os.path.join(c.run_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    grpo = [r for r in rows if r["stage"] == "grpo"]
    assert len(grpo) == GRPO_STEPS and all(r["solver"] == "simulated" for r in rows)
    scores = [r["score/mean"] for r in grpo]
    q = GRPO_STEPS // 4
    first, last = statistics.fmean(scores[:q]), statistics.fmean(scores[-q:])
    print("score/mean per GRPO step:", " ".join(f"{s:.3f}" for s in scores))
    # Flat (no learning) differs between quarters by about 0.03 (std, from the edits' score spread).
    assert last > first + 0.08, f"the candidates' score did not rise: first quarter {first:.3f}, last {last:.3f}"
