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
    batch = np.asarray(grpo.group_advantages(jnp.asarray(REWARDS), G, "batch", ddof=0, eps=0.0))
    np.testing.assert_allclose(batch, centred / REWARDS.std(), rtol=1e-5)
    batch1 = np.asarray(grpo.group_advantages(jnp.asarray(REWARDS), G, "batch", ddof=1, eps=0.0))
    np.testing.assert_allclose(batch1, centred / REWARDS.std(ddof=1), rtol=1e-5)
    # Equal rewards in a group: zero advantage, no NaN.
    assert np.all(np.asarray(grpo.group_advantages(jnp.ones(6), G)) == 0)
    with pytest.raises(ValueError, match="multiple of group_size"):
        grpo.group_advantages(jnp.ones(5), G)


def test_default_std_is_torch_std_as_in_trl():
    """LossConfig's default ddof is 1, torch.std's: [1, 0, 0, 0] has mean 1/4 and sample std
    sqrt((9/16 + 3/16) / 3) = 1/2, so advantages (3/2, -1/2, -1/2, -1/2); the population std
    sqrt(3)/4 gives 1.1547x those (sqrt(4/3)), 1.069x at G = 8 (sqrt(8/7))."""
    r = jnp.asarray([1.0, 0.0, 0.0, 0.0])
    default = LossConfig()
    adv = np.asarray(grpo.group_advantages(r, 4, default.std_scaling, default.std_ddof, eps=0.0))
    np.testing.assert_allclose(adv, [1.5, -0.5, -0.5, -0.5], rtol=1e-6)
    pop = np.asarray(grpo.group_advantages(r, 4, "group", ddof=0, eps=0.0))
    np.testing.assert_allclose(pop / adv, np.sqrt(4 / 3), rtol=1e-6)
    with pytest.raises(ValueError, match="ddof=1"):
        grpo.group_advantages(jnp.ones(3), 1, "group", ddof=1)


def test_zero_variance_groups_by_hand():
    r = jnp.asarray([0.3, 0.3, 0.3, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5 + 1e-3])
    assert np.asarray(grpo.zero_variance_groups(r, 3)).tolist() == [True, False, True, False]


def test_truncated_importance_weight_by_hand():
    """Token weights min(pi_old / pi_sampler, cap): ratios 2, 0.5, 1 and 4 with cap 1.5 ->
    1.5, 0.5, 1, 1.5; they multiply the clipped surrogate of each token, not the KL term."""
    old = np.log(np.array([[0.5, 0.3], [0.2, 0.8]], np.float32))
    sampler = np.log(np.array([[0.25, 0.6], [0.2, 0.2]], np.float32))
    w = np.asarray(grpo.truncated_is_weight(jnp.asarray(old), jnp.asarray(sampler), 1.5))
    np.testing.assert_allclose(w, [[1.5, 0.5], [1.0, 1.5]], rtol=1e-6)
    # At the first update logp == old: ratio 1, surrogate -A per token. A = (1, -2), mask all ones.
    logp, adv, mask = jnp.asarray(old), jnp.asarray([1.0, -2.0]), jnp.ones((2, 2))
    s, d, m = grpo.grpo_loss(logp, logp, logp + 0.3, adv, mask, eps_low=0.2, eps_high=0.2, beta=0.1,
                             kl_estimator="k1", aggregation="token_mean", is_weight=jnp.asarray(w))
    # Policy: -(1.5 + 0.5) * 1 - (1.0 + 1.5) * (-2) = 3; KL k1 = logp - ref = -0.3 per token, x beta x 4.
    np.testing.assert_allclose(float(s), 3.0 + 0.1 * (-0.3) * 4, rtol=1e-5)
    assert float(d) == 4.0
    np.testing.assert_allclose(float(m["tis/weight"]), 4.5, rtol=1e-6)


def test_a_row_without_tokens_is_no_sequence():
    """A dropped group's rows (mask 0) leave the sequence count of the seq_mean modes; dr_grpo keeps
    its constant B * max_tokens."""
    x = np.array([[1.0, 2.0], [3.0, 5.0], [7.0, 11.0]], np.float32)
    mask = np.array([[1, 1], [1, 0], [0, 0]], np.float32)
    s, d = grpo.aggregate(jnp.asarray(x), jnp.asarray(mask), "seq_mean_token_mean")
    np.testing.assert_allclose(float(s) / float(d), ((1 + 2) / 2 + 3) / 2, rtol=1e-6)
    s, d = grpo.aggregate(jnp.asarray(x), jnp.asarray(mask), "seq_mean_token_sum")
    np.testing.assert_allclose(float(s) / float(d), (3 + 3) / 2, rtol=1e-6)
    s, d = grpo.aggregate(jnp.asarray(x), jnp.asarray(mask), "dr_grpo", max_tokens=4)
    np.testing.assert_allclose(float(s) / float(d), 6 / (3 * 4), rtol=1e-6)


def _stats(rewards):
    from hljax.rl.rollout import COL, KINDS, STATS

    stats = np.zeros((len(rewards), len(STATS)))
    stats[:, COL["reward"]] = rewards
    stats[:, COL["kind"]] = [KINDS.index("infra_error" if np.isnan(r) else "ran") for r in rewards]
    return stats


@pytest.mark.parametrize("mode", ["keep", "drop"])
def test_zero_variance_groups_are_counted_and_dropped_on_request(mode):
    from hljax.rl.rollout import score_groups

    # Groups of 2: (1, 0) varies; (0.5, 0.5) and (0, 0) are flat; (nan, 1) has an infrastructure error.
    rewards = [1.0, 0.0, 0.5, 0.5, 0.0, 0.0, np.nan, 1.0]
    adv, keep, m = score_groups(_stats(rewards), 2, LossConfig(zero_variance_groups=mode, std_ddof=1, adv_eps=1e-4))
    # Group 1: mean 1/2, sample std sqrt(1/2): +-(1/2) / (sqrt(1/2) + 1e-4); flat groups: 0.
    a = 0.5 / (np.sqrt(0.5) + 1e-4)
    np.testing.assert_allclose(adv[:6], [a, -a, 0, 0, 0, 0], rtol=1e-6)
    flat_kept = mode == "keep"
    assert keep.tolist() == [True, True, flat_kept, flat_kept, flat_kept, flat_kept, False, False]
    assert m["groups/zero_variance"] == 2  # The infrastructure-error group is not counted as flat.
    assert m["groups/dropped"] == (1 if flat_kept else 3)
    # reward/mean covers every group that had rewards, dropped for zero variance or not.
    assert m["reward/mean"] == pytest.approx((1 + 0 + 0.5 + 0.5 + 0 + 0) / 6)


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
    adv = grpo.group_advantages(jnp.asarray(REWARDS), G, ddof=0)

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
    assert LossConfig(tis_cap=0).tis_cap is None and LossConfig(tis_cap=2).tis_cap == 2
    with pytest.raises(ValueError, match="tis_cap must be > 0"):
        LossConfig(tis_cap=-1.0)
    with pytest.raises(ValueError, match="zero_variance_groups 'resample'"):
        LossConfig(zero_variance_groups="resample")
