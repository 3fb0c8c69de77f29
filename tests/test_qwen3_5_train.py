"""Training Qwen3.5 (the paper's proposer): train-path log-probs and one SGD update against transformers."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from flax import nnx
from safetensors.numpy import load_file

from hljax import sharding as shd
from hljax.checkpoint import hf
from hljax.rl.batching import pack, split_micro
from hljax.rl.config import LossConfig
from hljax.rl.train_step import TrainBatch, batch_sharding, sequence_logprobs_jit, train_step
from tests import tiny
from tests import tiny_qwen3_5 as tq

L = 48  # Not a multiple of the GDN chunk (16 below), and rows end at different places.
RNG = np.random.default_rng(1)
PROMPTS = [RNG.integers(3, 160, n).tolist() for n in (5, 19, 3, 12)]
COMPLETIONS = [RNG.integers(3, 160, n).tolist() for n in (30, 3, 22, 9)]
LR = 0.5


@pytest.fixture(scope="module")
def tiny_text(tmp_path_factory):
    return tq.save(tmp_path_factory.mktemp("q35train"), vision=False)


def _completion_ce(ref: torch.nn.Module, seqs, temperature: float = 1.0) -> torch.Tensor:
    logits = ref(input_ids=torch.from_numpy(seqs.tokens).long(),
                 attention_mask=torch.from_numpy(seqs.attention_mask).long()).logits.double()
    lsm = torch.log_softmax(logits[:, :-1] / temperature, -1)
    logp = torch.gather(lsm, -1, torch.from_numpy(seqs.tokens[:, 1:, None]).long())[..., 0]
    mask = torch.from_numpy(seqs.loss_mask[:, :-1]).double()
    return logp, mask


def test_train_path_logprobs_match_transformers(tiny_text):
    ref = tq.causal_lm(tiny_text)
    seqs = pack(PROMPTS, COMPLETIONS, L)
    with torch.no_grad():
        want, mask = _completion_ce(ref, seqs, temperature=0.7)
    mesh = shd.single_device_mesh()
    model = hf.load_hf(tiny_text, mesh, linear_chunk_size=16)
    with shd.use_mesh(mesh):
        got = np.asarray(sequence_logprobs_jit(model, jax.tree.map(jnp.asarray, seqs), 0.7, 16))
    real = mask.numpy().astype(bool)
    np.testing.assert_allclose(got[:, :-1][real], want.numpy()[real], atol=1e-4)


def test_one_sft_step_equals_torch_sgd_on_every_weight(tiny_text, tmp_path):
    """Our SFT gradient step (with remat, as the real configs train), exported to HF, equals torch SGD on
    transformers' model: every tensor, including the Gated DeltaNet decay (A_log), time-step bias, causal conv
    and gates. Remat recomputes, it does not change the maths, so this also covers the plain step."""
    seqs = pack(PROMPTS, COMPLETIONS, L)
    ref = tq.causal_lm(tiny_text).train()
    logp, mask = _completion_ce(ref, seqs)
    loss = -(logp * mask).sum() / mask.sum()
    want = tiny.torch_sgd_step(ref, loss, LR)

    mesh = shd.single_device_mesh()
    model = hf.load_hf(tiny_text, mesh, linear_chunk_size=16, remat=True)
    with shd.use_mesh(mesh):
        opt = nnx.Optimizer(model, optax.sgd(LR), wrt=nnx.Param)
        m = lambda x: split_micro(np.asarray(x), 2)  # noqa: E731
        zeros = np.zeros_like(seqs.loss_mask)
        batch = TrainBatch(seqs=jax.tree.map(m, seqs), advantages=m(np.zeros(4, np.float32)),
                           old_logp=m(zeros), ref_logp=m(zeros), sampler_logp=m(zeros))
        batch = jax.device_put(batch, batch_sharding(mesh))
        metrics = jax.device_get(train_step(model, opt, batch, LossConfig(mode="sft", logprob_chunk=16)))
    np.testing.assert_allclose(metrics["loss"], loss.item(), rtol=1e-5)

    got = load_file(f"{hf.save_hf(model, str(tmp_path / 'out'), dtype='float32')}/model.safetensors")
    assert set(got) == set(want)
    before = load_file(f"{tiny_text}/model.safetensors")
    moved = [k for k in want if np.abs(want[k] - before[k]).max() > 1e-3]
    assert any("A_log" in k for k in moved) and any("conv1d" in k for k in moved), moved
    for k in want:
        np.testing.assert_allclose(got[k], want[k], atol=2e-5, rtol=1e-4, err_msg=k)
