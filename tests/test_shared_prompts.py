"""grpo.share_prompts: each group's prompt runs through the model once, its keys and values (Qwen3.5:
also its linear-attention state) shared by the group's rows. Checked against transformers on the rows
run whole: log-probs, and one GRPO update of every weight."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
import transformers
from flax import nnx
from safetensors.numpy import load_file

from hljax import sharding as shd
from hljax.checkpoint import hf
from hljax.kernels import cpu_decode
from hljax.mesh import MeshConfig
from hljax.rl.batching import pack, pack_prefixes, shared_prompts, split_micro
from hljax.rl.config import LossConfig
from hljax.rl.logprobs import Prefix
from hljax.rl.train_step import TrainBatch, global_batch, local_logprobs, sequence_logprobs_jit, share_group, train_step
from tests import tiny
from tests import tiny_qwen3_5 as tq

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
G = 2
RNG = np.random.default_rng(7)
# A prompt of one token (an empty prefix), prompts of different lengths, completions ending apart.
GROUP_PROMPTS = [RNG.integers(3, 160, n).tolist() for n in (13, 1, 20, 6)]
PROMPTS = [p for p in GROUP_PROMPTS for _ in range(G)]
COMPLETIONS = [RNG.integers(3, 160, n).tolist() for n in (9, 3, 14, 5, 1, 11, 7, 4)]
ADV = np.array([1.0, -1.0, 0.5, -0.5, 0.3, -0.3, 2.0, -2.0], np.float32)
LR = 0.5
FULL_LEN = 40


@pytest.fixture(scope="module")
def tiny_q35(tmp_path_factory):
    return tq.save(tmp_path_factory.mktemp("q35share"), vision=False)


KERNELS = cpu_decode.availability()
# The attention kernel on the shared layout: attention over a cache of prefix + own keys, T > 1.
WITH_KERNEL = pytest.param("tiny_h32", marks=pytest.mark.skipif(KERNELS is not None,
                                                               reason=f"CPU kernels unavailable: {KERNELS}"))


def _models(request, name):
    """(path, transformers model, hf.load_hf keyword arguments) of the tiny Qwen3 or Qwen3.5."""
    path = request.getfixturevalue(name)
    if name == "tiny_q35":
        return path, tq.causal_lm(path), dict(linear_chunk_size=16)
    if name == "tiny_h32":
        return path, transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager"), dict(
            attention_kernel=True)
    return path, transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager"), {}


def _shared(n_groups=4, share=G):
    """The first n_groups groups in the shared layout, `share` rows to a prefix: (rows' Sequences,
    Prefix, row prompts)."""
    n = n_groups * G
    prefixes, starts = shared_prompts(PROMPTS[:n], share)
    seqs = pack(starts, COMPLETIONS[:n], 24)
    return seqs, Prefix(*pack_prefixes(prefixes, 32)), starts


def _torch_logp(ref, n_rows=8):
    """transformers on the rows run whole: [B, L - 1] log-probs of each next token, and the completion mask."""
    seqs = pack(PROMPTS[:n_rows], COMPLETIONS[:n_rows], FULL_LEN)
    logits = ref(input_ids=torch.from_numpy(seqs.tokens).long(),
                 attention_mask=torch.from_numpy(seqs.attention_mask).long()).logits.double()
    lsm = torch.log_softmax(logits[:, :-1], -1)
    logp = torch.gather(lsm, -1, torch.from_numpy(seqs.tokens[:, 1:, None]).long())[..., 0]
    return logp, torch.from_numpy(seqs.loss_mask[:, :-1]).double()


def _completion_values(rows: np.ndarray, prompts) -> list[np.ndarray]:
    """[B, L] per-position values -> each row's values at its completion tokens."""
    return [rows[b, len(p) - 1:len(p) - 1 + len(c)] for b, (p, c) in enumerate(zip(prompts, COMPLETIONS))]


def test_a_group_shares_one_prompt_and_prefixes_are_left_padded():
    with pytest.raises(ValueError, match="rows 0 and 1 of one group have different prompts"):
        shared_prompts([[1, 2, 3], [1, 2, 4]], 2)
    assert shared_prompts([[5, 6, 7], [5, 6, 7], [9], [9]], 2) == ([[5, 6], []], [[7], [7], [9], [9]])
    tokens, mask = pack_prefixes([[5, 6], []], 4)
    assert tokens.tolist() == [[0, 0, 5, 6], [0, 0, 0, 0]] and mask.tolist() == [[0, 0, 1, 1], [0, 0, 0, 0]]


@pytest.mark.parametrize("name", ["tiny_untied", "tiny_q35"])
def test_shared_prompt_logprobs_match_transformers_on_whole_rows(request, name):
    path, ref, kwargs = _models(request, name)
    with torch.no_grad():
        want, _ = _torch_logp(ref.eval())
    mesh = shd.single_device_mesh()
    model = hf.load_hf(path, mesh, **kwargs)
    seqs, prefix, starts = _shared()
    with shd.use_mesh(mesh):  # Chunk 16 on 24 positions: the last chunk is padded.
        got = np.asarray(sequence_logprobs_jit(model, jax.tree.map(jnp.asarray, seqs), 1.0, 16,
                                               jax.tree.map(jnp.asarray, prefix)))
    for g, w in zip(_completion_values(got, starts), _completion_values(want.numpy(), PROMPTS)):
        np.testing.assert_allclose(g, w, atol=1e-4)


def _grpo_batch(seqs, prefix, old, n_micro=1):
    m = lambda x: split_micro(np.asarray(x), n_micro)  # noqa: E731
    return TrainBatch(seqs=jax.tree.map(m, seqs), advantages=m(ADV[:len(old)]), old_logp=m(old), ref_logp=m(old),
                      sampler_logp=m(old), prefix=jax.tree.map(m, prefix))


GRPO = LossConfig(mode="grpo", aggregation="token_mean", beta=0.0, eps_low=0.2, eps_high=0.28, logprob_chunk=16)


@pytest.mark.parametrize("name", ["tiny_untied", "tiny_q35", WITH_KERNEL])
def test_one_grpo_step_on_shared_prompts_equals_torch_sgd_on_whole_rows(request, name, tmp_path):
    """At ratio 1 the clipped loss's gradient is -adv * grad log p, token mean: every weight after one
    SGD step, prompt-side ones included (the prefix's keys and values get the G rows' gradients summed)."""
    path, ref, kwargs = _models(request, name)
    ref.train()
    logp, mask = _torch_logp(ref)
    adv = torch.from_numpy(ADV).double()[:, None]
    loss = -(adv * torch.exp(logp - logp.detach()) * mask).sum() / mask.sum()
    want = tiny.torch_sgd_step(ref, loss, LR)

    mesh = shd.single_device_mesh()
    model = hf.load_hf(path, mesh, **kwargs)
    seqs, prefix, _ = _shared()
    with shd.use_mesh(mesh):
        old = np.asarray(sequence_logprobs_jit(model, jax.tree.map(jnp.asarray, seqs), 1.0, 16,
                                               jax.tree.map(jnp.asarray, prefix)))
        opt = nnx.Optimizer(model, optax.sgd(LR), wrt=nnx.Param)
        metrics = jax.device_get(train_step(model, opt, global_batch(_grpo_batch(seqs, prefix, old, 2), mesh, 8), GRPO))
    np.testing.assert_allclose(metrics["loss"], loss.item(), rtol=1e-5, atol=1e-6)
    got = load_file(f"{hf.save_hf(model, str(tmp_path / 'out'), dtype='float32')}/model.safetensors")
    before = load_file(f"{path}/model.safetensors")
    moved = [k for k in want if np.abs(want[k] - before[k]).max() > 1e-4]
    assert any("k_proj" in k for k in moved), moved
    for k in want:
        np.testing.assert_allclose(got[k], want[k], atol=2e-5, rtol=1e-4, err_msg=k)


@pytest.mark.parametrize("n_groups", [4, 3])  # Per device 4 rows (2 groups), or 3 (rows share by 1).
def test_shared_prompts_on_a_data_parallel_mesh_equal_one_device(tiny_untied, n_groups):
    B, n_micro = n_groups * G, 1
    results = []
    for mesh in (shd.single_device_mesh(), shd.make_mesh(MeshConfig(1, 2, 1), jax.devices()[:2])):
        share = share_group(mesh, B, n_micro, G)
        seqs, prefix, _ = _shared(n_groups, share)
        model = hf.load_hf(tiny_untied, mesh)
        old = local_logprobs(model, mesh, seqs, B, n_micro, 1.0, 16, prefix)
        with shd.use_mesh(mesh):
            opt = nnx.Optimizer(model, optax.sgd(LR), wrt=nnx.Param)
            train_step(model, opt, global_batch(_grpo_batch(seqs, prefix, old, n_micro), mesh, B), GRPO)
        results.append((share, old, {"/".join(map(str, k)): np.asarray(v.get_value())
                                     for k, v in nnx.to_flat_state(nnx.state(model))}))
    (s1, old1, p1), (s2, old2, p2) = results
    assert (s1, s2) == (G, G if n_groups == 4 else 1)
    np.testing.assert_allclose(old2, old1, atol=1e-5)
    for k in p1:
        np.testing.assert_allclose(p2[k], p1[k], atol=1e-5, err_msg=k)


def test_share_group_is_what_one_device_holds_of_a_group():
    mesh8 = shd.make_mesh(MeshConfig(1, 8, 1), jax.devices()[:8])
    assert share_group(shd.single_device_mesh(), 20, 1, 4) == 4  # The tiny default.
    assert share_group(mesh8, 64, 1, 8) == 8  # 8 rows per device: whole groups.
    assert share_group(mesh8, 16, 1, 4) == 2  # 2 rows per device: half groups.
    assert share_group(mesh8, 8, 1, 4) == 1  # One row per device.
    assert share_group(mesh8, 48, 2, 4) == 1  # 3 rows per device per micro-batch.


def test_a_long_shared_prefix_trains_in_one_attention_block():
    """The shared-prefix pass's attention in causal blocks crashed jaxlib 0.10.2's YNNPACK dot
    (SIGSEGV) in the train step from 1,200-token prefixes on, so that pass runs as one block
    (ops.whole_causal_attention). In a child process: a crash fails this test, not the session."""
    code = """
import jax, numpy as np, optax
from flax import nnx
from hljax import sharding as shd
from hljax.models import qwen3
from hljax.models.config import ModelConfig
from hljax.rl.batching import pack, pack_prefixes, shared_prompts, split_micro
from hljax.rl.config import LossConfig
from hljax.rl.logprobs import Prefix
from hljax.rl.train_step import TrainBatch, global_batch, train_step
rng = np.random.default_rng(0)
prompts = [p for p in (rng.integers(1, 6000, 1200).tolist() for _ in range(5)) for _ in range(4)]
prefixes, starts = shared_prompts(prompts, 4)
seqs = pack(starts, [rng.integers(1, 6000, 100).tolist() for _ in prompts], 128)
prefix = Prefix(*pack_prefixes(prefixes, 1280))
mesh = shd.single_device_mesh()
model = qwen3.create(ModelConfig.tiny(6720), mesh)
with shd.use_mesh(mesh):
    opt = nnx.Optimizer(model, optax.adamw(1e-4), wrt=nnx.Param)
m = lambda x: split_micro(np.asarray(x), 1)
z = np.zeros(seqs.tokens.shape, np.float32)
batch = TrainBatch(seqs=jax.tree.map(m, seqs), advantages=m(rng.normal(size=20).astype(np.float32)), old_logp=m(z),
                   ref_logp=m(z), sampler_logp=m(z), prefix=jax.tree.map(m, prefix))
with shd.use_mesh(mesh):
    print(float(jax.device_get(train_step(model, opt, global_batch(batch, mesh, 20), LossConfig(mode="grpo")))["loss"]))
"""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    assert np.isfinite(float(out.stdout.strip().splitlines()[-1]))
