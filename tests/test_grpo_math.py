"""GRPO maths against numpy written independently here, from the papers' definitions."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hljax.rl import grpo
from hljax.rl.config import LossConfig

RNG = np.random.default_rng(0)
B, T, G = 6, 5, 3
LOGP = RNG.normal(-2, 0.5, (B, T)).astype(np.float32)
OLD = (LOGP + RNG.normal(0, 0.3, (B, T))).astype(np.float32)
REF = (LOGP + RNG.normal(0, 0.3, (B, T))).astype(np.float32)
MASK = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0],
                 [1, 1, 0, 0, 0], [1, 1, 1, 1, 0], [0, 1, 1, 1, 1]], np.float32)
REWARDS = np.array([1.0, 0.0, 0.5, 0.2, 0.2, 0.9], np.float32)


def test_group_advantages_by_hand():
    # Group 1: [1, 0, 0.5] mean 0.5, population std sqrt(1/6); group 2: [0.2, 0.2, 0.9] mean 13/30.
    adv = np.asarray(grpo.group_advantages(jnp.asarray(REWARDS), G, "group", ddof=0, eps=0.0))
    s1 = np.sqrt(((0.5**2) * 2) / 3)
    m2 = (0.2 + 0.2 + 0.9) / 3
    s2 = np.sqrt(((0.2 - m2) ** 2 * 2 + (0.9 - m2) ** 2) / 3)
    np.testing.assert_allclose(adv, [0.5 / s1, -0.5 / s1, 0, (0.2 - m2) / s2, (0.2 - m2) / s2, (0.9 - m2) / s2],
                               rtol=1e-5)
    sample_std = np.asarray(grpo.group_advantages(jnp.asarray(REWARDS), G, "group", ddof=1, eps=0.0))
    np.testing.assert_allclose(sample_std[0], 0.5 / np.sqrt(0.25), rtol=1e-5)  # sample std of [1,0,.5] = 0.5
    centred = np.asarray(grpo.group_advantages(jnp.asarray(REWARDS), G, "none"))
    np.testing.assert_allclose(centred, [0.5, -0.5, 0, 0.2 - m2, 0.2 - m2, 0.9 - m2], rtol=1e-5, atol=1e-7)
    batch = np.asarray(grpo.group_advantages(jnp.asarray(REWARDS), G, "batch", eps=0.0))
    np.testing.assert_allclose(batch, centred / REWARDS.std(), rtol=1e-5)
    # Equal rewards in a group: zero advantage, no NaN.
    assert np.all(np.asarray(grpo.group_advantages(jnp.ones(6), G)) == 0)
    with pytest.raises(ValueError, match="multiple of group_size"):
        grpo.group_advantages(jnp.ones(5), G)


def test_clipping_at_eps_low_and_eps_high():
    adv = np.array([1.0, -1.0, 1.0, -1.0], np.float32)
    old = np.zeros((4, 1), np.float32)
    ratio = np.array([[1.5], [1.5], [0.5], [0.5]], np.float32)
    loss, clipped = grpo.clipped_surrogate(jnp.log(ratio), jnp.asarray(old), jnp.asarray(adv), 0.2, 0.28)
    # A>0, r=1.5 -> capped at 1.28; A<0, r=1.5 -> unclipped -1.5; A>0, r=.5 -> .5; A<0, r=.5 -> floor .8.
    np.testing.assert_allclose(np.asarray(loss)[:, 0], [-1.28, 1.5, -0.5, 0.8], rtol=1e-6)
    assert np.asarray(clipped)[:, 0].tolist() == [True, False, False, True]


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_estimators(estimator):
    got = np.asarray(grpo.kl_penalty(jnp.asarray(LOGP), jnp.asarray(REF), estimator))
    r = np.exp(REF.astype(np.float64) - LOGP)  # pi_ref / pi
    want = {"k1": -np.log(r), "k2": 0.5 * np.log(r) ** 2, "k3": r - 1 - np.log(r)}[estimator]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "dr_grpo"])
def test_aggregations(mode):
    x = RNG.normal(size=(B, T)).astype(np.float32)
    s, d = grpo.aggregate(jnp.asarray(x), jnp.asarray(MASK), mode, max_tokens=8)
    lengths = MASK.sum(1)
    want = {
        "token_mean": (x * MASK).sum() / MASK.sum(),
        "seq_mean_token_mean": np.mean([(x[b] * MASK[b]).sum() / lengths[b] for b in range(B)]),
        "seq_mean_token_sum": np.mean([(x[b] * MASK[b]).sum() for b in range(B)]),
        "dr_grpo": (x * MASK).sum() / (B * 8),
    }[mode]
    np.testing.assert_allclose(float(s) / float(d), want, rtol=1e-5)


def test_aggregation_is_exact_across_micro_batches():
    x = RNG.normal(size=(B, T)).astype(np.float32)
    for mode in ["token_mean", "seq_mean_token_mean"]:
        whole = grpo.aggregate(jnp.asarray(x), jnp.asarray(MASK), mode)
        parts = [grpo.aggregate(jnp.asarray(x[i : i + 2]), jnp.asarray(MASK[i : i + 2]), mode) for i in (0, 2, 4)]
        np.testing.assert_allclose(sum(float(p[0]) for p in parts) / sum(float(p[1]) for p in parts),
                                   float(whole[0]) / float(whole[1]), rtol=1e-5, atol=1e-6)


def test_grpo_loss_with_kl_matches_numpy():
    adv = RNG.normal(size=B).astype(np.float32)
    s, d, m = grpo.grpo_loss(jnp.asarray(LOGP), jnp.asarray(OLD), jnp.asarray(REF), jnp.asarray(adv),
                             jnp.asarray(MASK), eps_low=0.2, eps_high=0.3, beta=0.05, kl_estimator="k3",
                             aggregation="token_mean")
    ratio = np.exp(LOGP.astype(np.float64) - OLD)
    surrogate = -np.minimum(ratio * adv[:, None], np.clip(ratio, 0.8, 1.3) * adv[:, None])
    r = np.exp(REF.astype(np.float64) - LOGP)
    per_token = surrogate + 0.05 * (r - 1 - np.log(r))
    np.testing.assert_allclose(float(s) / float(d), (per_token * MASK).sum() / MASK.sum(), rtol=1e-5)
    assert float(d) == MASK.sum()


def test_mu1_gradient_is_reinforce_with_group_normalised_advantages():
    """At the first update old == current, so d(loss)/d(logp) = -A / denom per token."""
    adv = grpo.group_advantages(jnp.asarray(REWARDS), G)

    def loss(logp):
        s, d, _ = grpo.grpo_loss(logp, jax.lax.stop_gradient(logp), None, adv, jnp.asarray(MASK), eps_low=0.2,
                                 eps_high=0.2, beta=0.0, kl_estimator="k3", aggregation="token_mean")
        return s / d

    g = np.asarray(jax.grad(loss)(jnp.asarray(LOGP)))
    r = REWARDS.reshape(-1, G)
    a = ((r - r.mean(1, keepdims=True)) / (r.std(1, keepdims=True) + 1e-4)).reshape(-1)
    np.testing.assert_allclose(g, -a[:, None] * MASK / MASK.sum(), rtol=1e-5, atol=1e-8)


def test_loss_config_validation():
    assert LossConfig(eps_low=0.2).eps_high == 0.2
    with pytest.raises(ValueError, match="aggregation 'tokenmean' is not one of"):
        LossConfig(aggregation="tokenmean")
    with pytest.raises(ValueError, match="dr_grpo aggregation|needs max_tokens"):
        LossConfig(aggregation="dr_grpo")
    with pytest.raises(ValueError, match="kl_estimator 'k4'"):
        LossConfig(kl_estimator="k4")
