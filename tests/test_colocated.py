"""The colocated rollout backend (issue 39): our engine in the trainer's process, handed the trainer's
weights as arrays. References: transformers on the new weights, and the disk path (an HF folder
loaded by `update_weights_from_disk`), which the embedded server's tests check against transformers."""

import json
import os
import subprocess
import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers
from flax import nnx

from hljax import sharding as shd
from hljax.checkpoint import hf
from hljax.generate.colocated import ColocatedGenerator, served_copy
from hljax.generate.engine import EngineConfig
from hljax.generate.local import LocalGenerator
from hljax.generate.types import InMemoryTrainable, SamplingParams
from hljax.rl.rollout import stale_versions
from tests import tiny
from tests.test_generate import _hf_greedy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    d = tmp_path_factory.mktemp("colocated")
    return tiny.save_hf_qwen3(d / "a", seed=0), tiny.save_hf_qwen3(d / "b", seed=1)


def _generator(path, dtype=jnp.float32):
    local = LocalGenerator.from_pretrained(path, shd.single_device_mesh(), EngineConfig(max_batch=8, max_seq_len=128),
                                           dtype=dtype)
    return ColocatedGenerator(local)


def _prompts():
    rng = np.random.default_rng(3)
    return [rng.integers(3, 160, n).tolist() for n in (9, 17)]


def test_greedy_after_an_in_memory_sync_equals_transformers_on_the_new_weights(folders):
    a, b = folders
    gen = _generator(a)
    assert isinstance(gen, InMemoryTrainable)
    prompts = _prompts()
    refs = {p: transformers.AutoModelForCausalLM.from_pretrained(p, attn_implementation="eager").eval() for p in (a, b)}
    before = [c[0].token_ids for c in gen.generate_ids(prompts, GREEDY)]
    assert [list(t) for t in before] == [_hf_greedy(refs[a], p, 12) for p in prompts]

    trainer = hf.load_hf(b, shd.single_device_mesh())  # The trainer's new weights, as arrays.
    gen.update_weights_from_model(trainer, weight_version="7")
    for leaf in jax.tree.leaves(nnx.state(trainer)):  # As the train step's donation does: the engine holds its own.
        leaf.delete()
    after = gen.generate_ids(prompts, GREEDY)
    want = [_hf_greedy(refs[b], p, 12) for p in prompts]
    assert [list(c[0].token_ids) for c in after] == want and want != [list(t) for t in before]
    assert {c[0].weight_version for c in after} == {"7"}
    gen.stop()


def test_bf16_engine_takes_fp32_weights_as_the_disk_path_would(folders):
    """An fp32 trainer, a bf16 engine: the in-memory copy is cast as loading the export in bf16 is, so
    tokens and log-probs of seeded samples equal the disk path's exactly."""
    a, b = folders
    memory, disk = _generator(a, jnp.bfloat16), _generator(a, jnp.bfloat16)
    memory.update_weights_from_model(hf.load_hf(b, shd.single_device_mesh()), weight_version="1")
    disk.update_weights_from_disk(b, weight_version="1")
    params = jax.tree.leaves(memory.engine.snapshot()[1])
    assert {p.dtype for p in params if p.ndim >= 2} == {jnp.dtype(jnp.bfloat16)}
    sampling = SamplingParams(max_new_tokens=10, temperature=0.8, seed=11, ignore_eos=True)
    got, want = (g.generate_ids(_prompts(), sampling, n=3, return_logprobs=True) for g in (memory, disk))
    for g, w in zip(sum(got, []), sum(want, [])):
        assert g.token_ids == w.token_ids and g.logprobs == w.logprobs
    memory.stop(), disk.stop()


def test_a_different_architecture_is_refused_and_the_old_weights_stay(folders, tmp_path):
    a, _ = folders
    gen = _generator(a)
    other = hf.load_hf(tiny.save_hf_qwen3(tmp_path / "wide", seed=2, intermediate_size=128), shd.single_device_mesh())
    with pytest.raises(ValueError, match="intermediate_size"):
        served_copy(other, gen.engine.model_config, gen.engine.mesh)
    with pytest.raises(ValueError, match="intermediate_size"):
        gen.update_weights_from_model(other, weight_version="9")
    assert gen.weight_version != "9"
    # Rollouts sampled now carry the old version: the GRPO step refuses them (Rollouts.collect).
    outs = gen.generate_ids(_prompts(), GREEDY)
    assert stale_versions(outs, "9") == [gen.weight_version] and stale_versions(outs, gen.weight_version) == []
    gen.stop()


def test_callers_on_threads_share_a_batch_and_sample_what_they_would_alone(folders):
    """The rollout's threads (one per revision state) submit at once: each gets what the same seeded
    request gets from the engine alone (a row's tokens depend on its prompt, weights and seed only)."""
    a, _ = folders
    gen = _generator(a)
    alone = LocalGenerator.from_pretrained(a, shd.single_device_mesh(), EngineConfig(max_batch=8, max_seq_len=128))
    prompts = _prompts()
    samplings = [SamplingParams(max_new_tokens=10, temperature=1.0, seed=s, ignore_eos=True) for s in (5, 6)]
    got = [None, None]

    def run(i):
        got[i] = gen.generate_ids([prompts[i]], samplings[i], n=4, return_logprobs=True)[0]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    for i in range(2):
        want = alone.generate_ids([prompts[i]], samplings[i], n=4, return_logprobs=True)[0]
        assert [c.token_ids for c in got[i]] == [c.token_ids for c in want]
        np.testing.assert_allclose([c.logprobs for c in got[i]], [c.logprobs for c in want], atol=1e-5)
    assert gen.engine.stats.prompt_tokens_received > 0
    gen.stop()


@pytest.mark.slow
def test_grpo_steps_with_colocated_rollouts(tmp_path):
    """launch.train with rollout.backend=colocated: two GRPO steps; the sampled tokens' log-probs equal
    the trainer's recomputed ones at both (the engine sampled from the synced weights), and no
    weights were written to disk for the sync."""
    run = str(tmp_path / "grpo")
    argv = [sys.executable, "-m", "launch.train", "--config", os.path.join(ROOT, "configs/tiny.py"),
            f"--config.run_dir={run}", "--config.rollout.backend=colocated", "--config.sft.steps=2",
            "--config.sft.eval_rows=0", "--config.grpo.steps=2", "--config.grpo.prompts_per_step=2",
            "--config.metrics.plots=False", "--config.metrics.backends=('jsonl',)", "--config.export.at_end=False"]
    out = subprocess.run(argv, cwd=ROOT, env={**os.environ, "XLA_FLAGS": "", "PYTHONPATH": ROOT},
                         capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    with open(os.path.join(run, "metrics.jsonl")) as f:
        grpo = [r for r in map(json.loads, f) if r["stage"] == "grpo"]
    assert len(grpo) == 2 and all(r["completion_tokens"] > 0 for r in grpo)
    assert all(r["sampler_logprob_gap"] < 1e-3 for r in grpo), [r["sampler_logprob_gap"] for r in grpo]
    assert all(r["time/sync_s"] < 5 for r in grpo)
    assert not os.path.exists(os.path.join(run, "sync"))
