"""The train step: log-probs vs transformers, exact accumulation, sharding, and the sign of GRPO."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
import transformers
from flax import nnx

from hljax import sharding as shd
from hljax.checkpoint import hf
from hljax.mesh import MeshConfig
from hljax.rl.batching import completion_logprobs, pack, place_completion_logprobs, split_micro
from hljax.rl.config import LossConfig, OptimConfig
from hljax.rl.train_step import (TrainBatch, batch_sharding, make_optimizer, mean_metrics, sequence_logprobs_jit,
                                 train_step)

L = 32
RNG = np.random.default_rng(0)
PROMPTS = [RNG.integers(3, 160, n).tolist() for n in (5, 9, 3, 12, 7, 4, 10, 6)]
COMPLETIONS = [RNG.integers(3, 160, n).tolist() for n in (8, 3, 11, 6, 2, 9, 5, 7)]
REWARDS = np.array([1.0, 0.0, 0.5, 0.0, 1.0, 0.2, 0.7, 0.1], np.float32)
OLD = RNG.normal(-5, 0.1, (8, L)).astype(np.float32)  # Off-policy old log-probs: exercise the ratio and clip.


def _batch(n_micro, adv=None):
    seqs = pack(PROMPTS, COMPLETIONS, L)
    adv = adv if adv is not None else (REWARDS - REWARDS.mean()).astype(np.float32)
    m = lambda x: split_micro(np.asarray(x), n_micro)  # noqa: E731
    return TrainBatch(seqs=jax.tree.map(m, seqs), advantages=m(adv), old_logp=m(OLD), ref_logp=m(OLD + 0.1),
                      sampler_logp=m(OLD))


# Plain SGD where updates must be compared exactly: Adam's g / sqrt(g^2) amplifies float noise in
# near-zero gradients into visible parameter differences.
SGD = optax.sgd(1.0)


def _setup(path, mesh, opt=SGD):
    model = hf.load_hf(path, mesh)
    tx = make_optimizer(opt) if isinstance(opt, OptimConfig) else opt
    with shd.use_mesh(mesh):
        optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    return model, optimizer


def _step(model, optimizer, batch, cfg, mesh):
    with shd.use_mesh(mesh):
        batch = jax.device_put(batch, batch_sharding(mesh))
        return jax.device_get(train_step(model, optimizer, batch, cfg))


def _params(model):
    return {"/".join(map(str, k)): np.asarray(v.get_value()) for k, v in nnx.to_flat_state(nnx.state(model))}


@pytest.mark.parametrize("lead", [0, 13])
def test_chunked_logprobs_match_transformers(tiny_untied, lead):
    """lead: tokens put before every prompt, so that the first completion starts mid-chunk, past a
    chunk that no row reads (the chunks then start at the first read position)."""
    ref = transformers.AutoModelForCausalLM.from_pretrained(tiny_untied, attn_implementation="eager").eval()
    seqs = pack([list(range(3, 3 + lead)) + p for p in PROMPTS], COMPLETIONS, L + lead)
    with torch.no_grad():
        logits = ref(input_ids=torch.from_numpy(seqs.tokens).long(),
                     attention_mask=torch.from_numpy(seqs.attention_mask).long()).logits.double()
    lsm = torch.log_softmax(logits / 0.7, -1).numpy()
    want = np.take_along_axis(lsm[:, :-1], seqs.tokens[:, 1:, None].astype(np.int64), -1)[..., 0]
    mesh = shd.single_device_mesh()
    model = hf.load_hf(tiny_untied, mesh)
    with shd.use_mesh(mesh):
        got = np.asarray(sequence_logprobs_jit(model, jax.tree.map(jnp.asarray, seqs), 0.7, 8))
    mask = seqs.loss_mask[:, :-1].astype(bool)
    np.testing.assert_allclose(got[:, :-1][mask], want[mask], atol=1e-4)


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean"])
def test_four_micro_batches_equal_one_big_batch(tiny_untied, aggregation):
    mesh = shd.single_device_mesh()
    cfg = LossConfig(aggregation=aggregation, beta=0.04, eps_low=0.2, eps_high=0.28, logprob_chunk=8)
    results = []
    for n_micro in (1, 4):
        model, opt = _setup(tiny_untied, mesh)
        metrics = _step(model, opt, _batch(n_micro, adv=(REWARDS - 0.4)), cfg, mesh)
        results.append((metrics, _params(model)))
    (m1, p1), (m4, p4) = results
    np.testing.assert_allclose(m4["loss"], m1["loss"], rtol=1e-5)
    for k in p1:
        np.testing.assert_allclose(p4[k], p1[k], atol=1e-5, err_msg=k)
    assert any(np.abs(p1[k] - _params(hf.load_hf(tiny_untied, mesh))[k]).max() > 1e-4 for k in p1)


@pytest.mark.slow
@pytest.mark.parametrize("mesh_cfg", [MeshConfig(1, 4, 2), MeshConfig(2, 2, 2)])
def test_sharded_step_equals_single_device(tiny_untied, mesh_cfg):
    cfg = LossConfig(beta=0.04, logprob_chunk=8)
    batch = _batch(2)
    out = []
    for mesh in (shd.single_device_mesh(), shd.make_mesh(mesh_cfg)):
        model, opt = _setup(tiny_untied, mesh)
        out.append((_step(model, opt, batch, cfg, mesh), _params(model)))
    (m1, p1), (m8, p8) = out
    np.testing.assert_allclose(m8["loss"], m1["loss"], rtol=1e-5, atol=1e-6)
    for k in p1:
        np.testing.assert_allclose(p8[k], p1[k], atol=1e-5, err_msg=k)


def test_grpo_steps_move_logprobs_the_right_way(tiny_untied):
    """One prompt, two completions: rewards 1 and 0. GRPO must raise the first, lower the second."""
    mesh = shd.single_device_mesh()
    model, opt = _setup(tiny_untied, mesh, OptimConfig(learning_rate=3e-3, max_grad_norm=0))
    prompt, good, bad = PROMPTS[0], COMPLETIONS[0], COMPLETIONS[1]
    seqs = pack([prompt, prompt], [good, bad], L)
    cfg = LossConfig(logprob_chunk=8)
    from hljax.rl import grpo

    adv = np.asarray(grpo.group_advantages(jnp.asarray([1.0, 0.0]), 2))

    def seq_logp():
        with shd.use_mesh(mesh):
            lp = np.asarray(sequence_logprobs_jit(model, jax.tree.map(jnp.asarray, seqs), 1.0, 8))
        return (lp * seqs.loss_mask).sum(1)

    before = seq_logp()
    for _ in range(3):
        old = np.zeros((2, L), np.float32)
        with shd.use_mesh(mesh):
            old[:] = np.asarray(sequence_logprobs_jit(model, jax.tree.map(jnp.asarray, seqs), 1.0, 8))
        m = lambda x: split_micro(np.asarray(x), 1)  # noqa: E731
        batch = TrainBatch(seqs=jax.tree.map(m, seqs), advantages=m(adv), old_logp=m(old), ref_logp=m(old),
                           sampler_logp=m(old))
        _step(model, opt, batch, cfg, mesh)
    after = seq_logp()
    assert after[0] > before[0] + 0.1 and after[1] < before[1] - 0.1, (before, after)


def test_sft_loss_is_completion_cross_entropy_and_decreases(tiny_untied):
    ref = transformers.AutoModelForCausalLM.from_pretrained(tiny_untied, attn_implementation="eager").eval()
    seqs = pack(PROMPTS[:4], COMPLETIONS[:4], L)
    with torch.no_grad():
        logits = ref(input_ids=torch.from_numpy(seqs.tokens).long(),
                     attention_mask=torch.from_numpy(seqs.attention_mask).long()).logits
    ce = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 160), torch.from_numpy(
        seqs.tokens[:, 1:]).long().reshape(-1), reduction="none").numpy().reshape(4, L - 1)
    mask = seqs.loss_mask[:, :-1]
    want = (ce * mask).sum() / mask.sum()

    mesh = shd.single_device_mesh()
    model, opt = _setup(tiny_untied, mesh, OptimConfig(learning_rate=1e-2))
    m = lambda x: split_micro(np.asarray(x), 2)  # noqa: E731
    zeros = np.zeros_like(seqs.loss_mask)
    batch = TrainBatch(seqs=jax.tree.map(m, seqs), advantages=m(np.zeros(4, np.float32)), old_logp=m(zeros),
                       ref_logp=m(zeros), sampler_logp=m(zeros))
    cfg = LossConfig(mode="sft", logprob_chunk=8)
    losses = [float(_step(model, opt, batch, cfg, mesh)["loss"]) for _ in range(5)]
    np.testing.assert_allclose(losses[0], want, rtol=1e-4)
    assert losses[-1] < losses[0] - 0.5, losses


def test_remat_train_step_equals_plain(tiny_untied):
    """The real configs train with remat: the jitted step (the model merged under value_and_grad) runs with it
    and gives the same loss and update."""
    mesh = shd.single_device_mesh()
    cfg = LossConfig(beta=0.04, logprob_chunk=8)
    out = []
    for remat in (False, True):
        model = hf.load_hf(tiny_untied, mesh, remat=remat)
        with shd.use_mesh(mesh):
            opt = nnx.Optimizer(model, SGD, wrt=nnx.Param)
        out.append((_step(model, opt, _batch(2), cfg, mesh), _params(model)))
    (m0, p0), (m1, p1) = out
    np.testing.assert_allclose(m1["loss"], m0["loss"], rtol=1e-5)
    for k in p0:
        np.testing.assert_allclose(p1[k], p0[k], atol=1e-5, err_msg=k)


def test_mu_updates_keep_old_logprobs_and_clip_from_the_second(tiny_untied):
    """grpo.mu = 2 as the trainer runs it: two steps on one batch whose old log-probs were computed
    once. The first update is on-policy (ratio 1: no clip, no drift); the second sees the moved policy
    against the fixed old log-probs, and its clip fraction is what the clipped surrogate says for the
    log-probs the model now gives (computed here in numpy)."""
    mesh = shd.single_device_mesh()
    model, opt = _setup(tiny_untied, mesh, OptimConfig(learning_rate=2e-2, max_grad_norm=0))
    seqs = pack(PROMPTS, COMPLETIONS, L)
    adv = np.asarray([1.0, -1.0] * 4, np.float32)
    with shd.use_mesh(mesh):
        old = np.asarray(sequence_logprobs_jit(model, jax.tree.map(jnp.asarray, seqs), 1.0, 8))
    m = lambda x: split_micro(np.asarray(x), 2)  # noqa: E731
    batch = TrainBatch(seqs=jax.tree.map(m, seqs), advantages=m(adv), old_logp=m(old), ref_logp=m(old),
                       sampler_logp=m(old))
    cfg = LossConfig(eps_low=0.2, eps_high=0.28, logprob_chunk=8)
    first = _step(model, opt, batch, cfg, mesh)
    with shd.use_mesh(mesh):
        moved = np.asarray(sequence_logprobs_jit(model, jax.tree.map(jnp.asarray, seqs), 1.0, 8))
    second = _step(model, opt, batch, cfg, mesh)
    assert float(first["clip_frac"]) == 0.0 and float(first["policy_drift"]) < 1e-5
    mask = seqs.loss_mask.astype(bool)
    ratio = np.exp(moved.astype(np.float64) - old)
    a = adv[:, None]
    clipped = np.clip(ratio, 0.8, 1.28) * a < ratio * a
    want = clipped[mask].mean()
    assert want > 0.05, want  # The policy moved past the clip range on some tokens.
    np.testing.assert_allclose(float(second["clip_frac"]), want, atol=1.5 / mask.sum())
    np.testing.assert_allclose(float(second["policy_drift"]), np.abs(moved - old)[mask].mean(), rtol=1e-3)
    assert mean_metrics([{"clip_frac": 0.0, "loss": 1.0}, {"clip_frac": 0.5, "loss": 3.0}]) == \
        {"clip_frac": 0.25, "loss": 2.0}


def test_truncated_importance_weight_in_the_step(tiny_untied):
    """Sampler log-probs 4x below the trainer's: every token's weight is min(4, 2) = 2, so at the
    first update (ratio 1, no KL) the loss is twice the unweighted one; with the sampler equal to the
    trainer the weight is 1 and the loss is the unweighted one."""
    mesh = shd.single_device_mesh()
    seqs = pack(PROMPTS, COMPLETIONS, L)
    model = hf.load_hf(tiny_untied, mesh)
    with shd.use_mesh(mesh):
        old = np.asarray(sequence_logprobs_jit(model, jax.tree.map(jnp.asarray, seqs), 1.0, 8))
    adv = (REWARDS - REWARDS.mean()).astype(np.float32)
    m = lambda x: split_micro(np.asarray(x), 2)  # noqa: E731
    out = {}
    for name, sampler, cap in [("off", old, None), ("equal", old, 2.0), ("low", old - np.log(4.0), 2.0)]:
        model, opt = _setup(tiny_untied, mesh)
        batch = TrainBatch(seqs=jax.tree.map(m, seqs), advantages=m(adv), old_logp=m(old), ref_logp=m(old),
                           sampler_logp=m(sampler))
        out[name] = _step(model, opt, batch, LossConfig(logprob_chunk=8, tis_cap=cap), mesh)
    # Ratio 1 at the first update: the loss is -sum(A * w * mask) / sum(mask).
    mask = seqs.loss_mask
    want = -(adv[:, None] * mask).sum() / mask.sum()
    np.testing.assert_allclose(float(out["off"]["loss"]), want, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(float(out["equal"]["loss"]), want, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(float(out["low"]["loss"]), 2 * want, rtol=1e-4, atol=1e-6)
    assert float(out["low"]["tis/weight"]) == pytest.approx(2.0) and float(out["low"]["tis/capped_frac"]) == 1.0
    assert float(out["equal"]["tis/weight"]) == pytest.approx(1.0) and float(out["equal"]["tis/capped_frac"]) == 0.0
    assert "tis/weight" not in out["off"]


def test_sampler_logprobs_are_placed_where_the_loss_reads():
    """pack puts completion token k's target at position len(prompt) - 1 + k: row 0 (prompt 3 tokens,
    completion 2) gets its two log-probs at positions 2 and 3; row 1 has none and keeps the fallback."""
    seqs = pack([[5, 6, 7], [8, 9]], [[10, 11], [12, 13, 14]], 8)
    fallback = np.full((2, 8), -9.0, np.float32)
    got = place_completion_logprobs([[-0.5, -1.5], []], [3, 2], [2, 3], fallback)
    want = fallback.copy()
    want[0, 2:4] = [-0.5, -1.5]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(seqs.loss_mask[0], [0, 0, 1, 1, 0, 0, 0, 0])
    np.testing.assert_array_equal(completion_logprobs(got[0], 3, 2), [-0.5, -1.5])
    with pytest.raises(ValueError, match="row 0: the sampler returned 1 log-probs for 2"):
        place_completion_logprobs([[-0.5], []], [3, 2], [2, 3], fallback)
