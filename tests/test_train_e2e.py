"""The embedded default end to end (shortened), and crash-resume reproducibility."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import orbax.checkpoint as ocp
import pytest
import transformers

from sandbox.isolation import bwrap_path as _bwrap_path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.skipif(_bwrap_path() is None, reason="bubblewrap (bwrap) not found: the sandbox refuses to start")


def _train(run_dir, *overrides, wait=True, timeout=600):
    env = {**os.environ, "XLA_FLAGS": "", "PYTHONPATH": ROOT}
    argv = [sys.executable, "-m", "launch.train", "--config", os.path.join(ROOT, "configs/tiny.py"),
            f"--config.run_dir={run_dir}", *overrides]
    if not wait:
        return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    return out.stdout + out.stderr


def _metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


GRPO_STEPS = 20  # The tiny default (configs/tiny.py) as shipped: 12 steps were too few to see seed 0 learn.
SFT_STEPS = 200


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """The tiny default with a small KL term (whose reference it checks)."""
    run = str(tmp_path_factory.mktemp("e2e") / "tiny")
    log = _train(run, f"--config.grpo.steps={GRPO_STEPS}", "--config.checkpoint.every=40", "--config.loss.beta=0.01",
                 timeout=1700)
    return run, log


# The module's first test pays for the tiny_run fixture (about 7 min on 2 idle cores): more than the
# suite's default timeout leaves when the machine is busy.
FIXTURE_TIMEOUT = pytest.mark.timeout(1800)


@pytest.mark.slow
@FIXTURE_TIMEOUT
def test_grpo_raises_the_candidates_score(tiny_run):
    """The learning signal end to end: with the simulated solver (whose scores depend on what the
    harness does), the sampled candidates' mean score rises over the GRPO steps. A sign flip between
    rewards and advantages, or a weight sync that leaves the proposer server on old weights, keeps it
    from rising (checked by hand: see the closing note of issue 17)."""
    run, _ = tiny_run
    scores = [r["score/mean"] for r in _metrics(run) if r["stage"] == "grpo"]
    q = len(scores) // 4
    first, last = sum(scores[:q]) / q, sum(scores[-q:]) / q
    print(f"GRPO candidate score: first quarter {first:.3f}, last quarter {last:.3f}: {scores}")
    # In the world of per-family weaknesses (issue 33) a run that does not learn (seed 0's SFT proposer,
    # GRPO at learning rate 0) moved by -0.026, its steps' scores spread by 0.030 (so quarter means by
    # about 0.019); the 3 seeds of the tiny default rose by 0.097, 0.046 and 0.084 (docs/benchmarks.md).
    assert last > first + 0.04, scores


@pytest.mark.slow
@FIXTURE_TIMEOUT
def test_tiny_run_end_to_end(tiny_run, tmp_path):
    run, log = tiny_run
    rows = _metrics(run)
    # Edit validity before and after SFT: in the metrics rows (so in TensorBoard) and in the summary.
    before, after = rows[0]["validity/before_sft"], rows[SFT_STEPS - 1]["validity/after_sft"]
    print(f"edit validity: untrained {before:.2f}, after SFT {after:.2f}")
    assert after > before
    assert f"edit validity before sft: {before:.2f}" in log and f"edit validity after sft: {after:.2f}" in log
    assert "GRPO score/mean: " in log

    assert [r["step"] for r in rows] == list(range(SFT_STEPS + GRPO_STEPS))
    assert rows[0]["stage"] == "sft" and rows[-1]["stage"] == "grpo"
    assert rows[-1]["sampler_logprob_gap"] < 1e-3  # Engine and trainer agree on the sampled tokens.
    # The KL reference is the policy GRPO started from (the SFT proposer), not the random init: at the
    # first GRPO step policy and reference are the same weights.
    assert rows[SFT_STEPS]["kl"] < 1e-5 and os.path.exists(os.path.join(run, "export-sft", "model.safetensors"))
    # Every proposal of every GRPO step is kept, with what it earned.
    with open(os.path.join(run, "rollouts.jsonl")) as f:
        sampled = [json.loads(line) for line in f]
    assert len(sampled) == GRPO_STEPS * 5 * 4 and {"completion", "reward", "advantage", "task"} <= set(sampled[0])
    assert {"reward/mean", "valid_rate", "ran_rate", "clip_frac", "entropy", "time/sandbox_s", "time/logprobs_s",
            "time/generate_s", "time/train_s", "time/sync_s"} <= set(rows[-1])
    assert "time/checkpoint_s" in rows[160]  # Step 159's save, in the row after it.
    assert "GRPO time: " in log and "train " in log.split("GRPO time: ")[1].splitlines()[0]
    assert os.path.getsize(os.path.join(run, "curves.png")) > 10_000
    assert any(f.startswith("events.out.tfevents") for f in os.listdir(os.path.join(run, "tensorboard")))
    assert sorted(ocp.CheckpointManager(os.path.join(run, "checkpoints")).all_steps()) == [159, 199, 219]
    model = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(run, "export"))
    assert model.config.num_hidden_layers == 2

    # launch.export of the last checkpoint gives the same weights as the run's own export.
    out = subprocess.run([sys.executable, "-m", "launch.export", "--checkpoint", os.path.join(run, "checkpoints"),
                          "--step", "219", "--out", str(tmp_path / "from_ckpt")], cwd=ROOT, capture_output=True,
                         text=True, env={**os.environ, "XLA_FLAGS": ""})
    assert out.returncode == 0, out.stderr[-3000:]
    from safetensors.numpy import load_file

    want = load_file(os.path.join(run, "export", "model.safetensors"))
    got = load_file(str(tmp_path / "from_ckpt" / "model.safetensors"))
    assert set(got) == set(want) and all(np.array_equal(got[k], want[k]) for k in want)


@pytest.mark.slow
@FIXTURE_TIMEOUT
@pytest.mark.parametrize("mode", ["offline", "online"])
def test_multistep_states_hold_proposer_harnesses(tiny_run, tmp_path, mode):
    """Multistep RL from the SFT export: after a refresh (offline) or a step (online) the state pool
    holds harnesses the proposer wrote, not only seeds."""
    run, _ = tiny_run
    out = str(tmp_path / mode)
    _train(out, "--config.mode=grpo", f"--config.model.path={os.path.join(run, 'export')}",
           f"--config.states.mode={mode}", "--config.grpo.steps=2", "--config.grpo.prompts_per_step=2",
           "--config.states.refresh_every=2",
           "--config.states.rounds=1", "--config.states.proposals=4", "--config.states.scoring_questions=2",
           "--config.states.max_new_tokens=160", "--config.states.temperature=0.7",
           "--config.tasks.families=('number_filtering', 'simple_equations')", "--config.metrics.plots=False",
           "--config.export.at_end=False")
    assert [r["step"] for r in _metrics(out)] == [0, 1]
    if mode == "offline":
        with open(os.path.join(out, "states", "phase0", "pool.json")) as f:
            pool = json.load(f)
        made = [e for e in pool if e["origin"] != "seed"]
    else:
        folder = os.path.join(out, "states", "online", "after_step1")
        made = [e for e in (json.load(open(os.path.join(folder, n))) for n in sorted(os.listdir(folder)))
                if e["origin"] != "seed"]
    assert made, f"{mode}: the state pool holds only seed harnesses"
    assert all("def solve" in e["harness"] for e in made)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_or_ctrl_c_checkpoints_and_exits(tmp_path, sig):
    run = str(tmp_path / "term")
    proc = _train(run, "--config.mode=sft", "--config.sft.steps=500", "--config.sft.eval_rows=0",
                  "--config.checkpoint.every=1000", wait=False)
    metrics = os.path.join(run, "metrics.jsonl")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (os.path.exists(metrics) and len(_metrics(run)) >= 3):
        time.sleep(0.5)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, out[-3000:]
    last = _metrics(run)[-1]["step"]
    assert f"{sig.name}: saved step {last}" in out and "Traceback" not in out, out[-3000:]
    assert ocp.CheckpointManager(os.path.join(run, "checkpoints")).all_steps() == [last]


@pytest.mark.slow
def test_sigkill_then_resume_and_grpo_from_the_sft_export_reproduce_the_uninterrupted_run(tmp_path):
    common = ["--config.sft.steps=4", "--config.grpo.steps=2", "--config.checkpoint.every=1", "--config.grpo.prompts_per_step=2",
              "--config.sft.eval_rows=0", "--config.metrics.plots=False", "--config.export.after_sft=True"]
    whole = str(tmp_path / "whole")
    _train(whole, *common)
    reference = _metrics(whole)

    def assert_same_steps(want, got, label):
        for a, b in zip(want, got, strict=True):
            for key in ("loss", "reward/mean", "valid_rate", "entropy", "completion_len"):
                np.testing.assert_allclose(b[key], a[key], rtol=1e-4, atol=1e-6, err_msg=f"{label}, step {a['step']} {key}")

    # GRPO alone from the whole run's SFT export, its steps numbered from 0 but its draws offset by the
    # run's SFT steps, draws the same states, questions and samples: it repeats the whole run's GRPO.
    alone = str(tmp_path / "alone")
    _train(alone, "--config.mode=grpo", f"--config.model.path={os.path.join(whole, 'export-sft')}",
           "--config.grpo.draw_offset=4", *[c for c in common if not c.startswith("--config.sft.steps")])
    assert_same_steps(reference[4:], _metrics(alone), "GRPO alone")
    rollouts = [[json.loads(line)["completion"] for line in open(os.path.join(r, "rollouts.jsonl"))] for r in (whole, alone)]
    assert rollouts[0] == rollouts[1] and len(rollouts[0]) == 2 * 2 * 4

    cut = str(tmp_path / "cut")
    kill_after = 4  # The first GRPO step: resume must rebuild rollouts, states and the proposer's weights.
    proc = _train(cut, *common, wait=False)
    deadline = time.monotonic() + 400
    ckpt = os.path.join(cut, "checkpoints")
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if os.path.isdir(ckpt) and kill_after in ocp.CheckpointManager(ckpt).all_steps():
                break
        except FileNotFoundError:  # The trainer's keep-N deleted a step while we listed them: look again.
            pass
        time.sleep(0.5)
    assert proc.poll() is None, "the run ended before it could be killed: " + proc.stdout.read()[-2000:]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    log = _train(cut, *common)
    assert f"resuming {cut} at step" in log
    resumed = _metrics(cut)
    assert [r["step"] for r in resumed] == [r["step"] for r in reference]
    assert_same_steps(reference[kill_after + 1 :], resumed[kill_after + 1 :], "resumed")


@pytest.mark.slow
def test_qwen3_5_proposer_trains_end_to_end(tmp_path):
    """The paper's proposer architecture through the whole trainer: SFT, then GRPO with our engine serving
    Qwen3.5 (recurrent decode) while the train step runs the chunked form; they must agree on every
    sampled token's log-prob, and the export must load in transformers as Qwen3.5."""
    run = str(tmp_path / "q35")
    _train(run, "--config.model.preset=tiny-qwen3.5", "--config.sft.steps=2", "--config.grpo.steps=2",
           "--config.grpo.prompts_per_step=2",
           "--config.sft.eval_rows=0", "--config.metrics.plots=False", "--config.metrics.backends=('jsonl',)")
    rows = _metrics(run)
    assert [r["stage"] for r in rows] == ["sft"] * 2 + ["grpo"] * 2
    assert all(r["sampler_logprob_gap"] < 1e-3 for r in rows[2:]), [r["sampler_logprob_gap"] for r in rows[2:]]
    assert rows[-1]["completion_tokens"] > 0
    model = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(run, "export"))
    assert model.config.model_type.startswith("qwen3_5") and "linear_attention" in model.config.layer_types
