"""GRPO maths as pure functions of arrays.

Shapes: B sequences (G completions per prompt, groups contiguous), T completion-aligned tokens.
Every loss returns `(loss_sum, denom)` so that gradient accumulation over micro-batches is exact:
the step loss is sum(loss_sum) / sum(denom), and denom never depends on the parameters.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hljax.rl.config import Aggregation, KLEstimator, StdScaling


def group_advantages(
    rewards: jax.Array, group_size: int, scale: StdScaling = "group", ddof: int = 1, eps: float = 1e-4
) -> jax.Array:
    """rewards: [B] -> advantages [B] = (r - group mean) / (std + eps).

    scale: "group" divides by each group's std (GRPO), "batch" by the whole batch's std (as in
    Dr. GRPO's critique of per-group scaling), "none" only centres. ddof: 1 is the sample std, torch.std's
    default, which TRL 1.16, verl and Tunix use; 0 the population std (a factor sqrt(G / (G - 1)) larger
    advantages, 1.069 at G = 8).
    """
    if rewards.ndim != 1 or rewards.shape[0] % group_size:
        raise ValueError(f"rewards must be [B] with B a multiple of group_size={group_size}, got {rewards.shape}")
    if scale != "none" and ddof >= (group_size if scale == "group" else rewards.shape[0]):
        raise ValueError(f"std with ddof={ddof} needs more than {ddof} rewards per {scale}, "
                         f"got group_size={group_size}")
    groups = rewards.reshape(-1, group_size)
    centred = groups - groups.mean(axis=1, keepdims=True)
    if scale == "group":
        centred = centred / (groups.std(axis=1, ddof=ddof, keepdims=True) + eps)
    elif scale == "batch":
        centred = centred / (rewards.std(ddof=ddof) + eps)
    elif scale != "none":
        raise ValueError(f"unknown std scaling {scale!r}")
    return centred.reshape(-1)


def zero_variance_groups(rewards: jax.Array, group_size: int, tol: float = 1e-9) -> jax.Array:
    """rewards: [B] -> [B / group_size] bool: groups whose rewards are all equal (to `tol`). Their
    advantages are 0, so they carry no policy gradient; DAPO's dynamic sampling removes them."""
    groups = rewards.reshape(-1, group_size)
    return (groups.max(axis=1) - groups.min(axis=1)) <= tol


def truncated_is_weight(old_logp: jax.Array, sampler_logp: jax.Array, cap: float) -> jax.Array:
    """old_logp, sampler_logp: [B, T] -> [B, T] min(exp(old_logp - sampler_logp), cap).

    Truncated importance sampling (TIS, Yao et al. 2025; verl's tis_imp_ratio_cap, slime's TIS) for the
    mismatch between the sampler that drew the tokens (e.g. a bf16 SGLang server) and the trainer's
    policy before the update: the weight multiplies each token's policy loss. No gradient flows
    through it (both inputs are data)."""
    return jnp.minimum(jnp.exp(old_logp - sampler_logp), cap)


def clipped_surrogate(
    logp: jax.Array, old_logp: jax.Array, advantages: jax.Array, eps_low: float, eps_high: float
) -> tuple[jax.Array, jax.Array]:
    """logp, old_logp: [B, T]; advantages: [B] -> (per-token loss [B, T], clipped? [B, T] bool).

    PPO's pessimistic bound with an asymmetric clip range [1 - eps_low, 1 + eps_high] (DAPO's
    clip-higher when eps_high > eps_low)."""
    ratio = jnp.exp(logp - old_logp)
    adv = advantages[:, None]
    unclipped = ratio * adv
    clipped = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
    return -jnp.minimum(unclipped, clipped), clipped < unclipped


def kl_penalty(logp: jax.Array, ref_logp: jax.Array, estimator: KLEstimator) -> jax.Array:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman 2020): [B, T] -> [B, T].

    k1 = log(pi/pi_ref) (unbiased, high variance), k2 = 0.5 * log(pi/pi_ref)^2,
    k3 = pi_ref/pi - 1 - log(pi_ref/pi) (unbiased, low variance, >= 0; GRPO's choice)."""
    log_ratio = logp - ref_logp
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio**2
    if estimator == "k3":
        return jnp.exp(-log_ratio) - 1.0 + log_ratio
    raise ValueError(f"unknown KL estimator {estimator!r}")


def aggregate(
    per_token: jax.Array, mask: jax.Array, mode: Aggregation, max_tokens: int | None = None
) -> tuple[jax.Array, jax.Array]:
    """per_token, mask: [B, T] -> (loss_sum, denom) whose ratio is the loss.

    token_mean: mean over all completion tokens of the batch (DAPO; TRL "dapo").
    seq_mean_token_mean: mean over sequences of each sequence's token mean (original GRPO).
    seq_mean_token_sum: mean over sequences of each sequence's token sum.
    dr_grpo: token sum divided by B * max_tokens, a constant budget (Dr. GRPO), so no length bias.

    A row whose mask is all 0 (a group dropped for an infrastructure error or zero variance) is no
    sequence of the batch: the sequence counts of seq_mean_* leave it out. dr_grpo keeps B, its
    constant. Every completion has a token, so with nothing dropped this is TRL's arithmetic.
    """
    mask = mask.astype(per_token.dtype)
    masked = per_token * mask
    n_seq = (mask.sum(axis=1) > 0).sum().astype(per_token.dtype)
    if mode == "token_mean":
        return masked.sum(), mask.sum()
    if mode == "seq_mean_token_mean":
        return (masked.sum(axis=1) / jnp.maximum(mask.sum(axis=1), 1.0)).sum(), n_seq
    if mode == "seq_mean_token_sum":
        return masked.sum(), n_seq
    if mode == "dr_grpo":
        if max_tokens is None:
            raise ValueError("dr_grpo aggregation needs max_tokens (the generation budget)")
        return masked.sum(), jnp.asarray(per_token.shape[0] * max_tokens, per_token.dtype)
    raise ValueError(f"unknown aggregation {mode!r}")


def grpo_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    ref_logp: jax.Array | None,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    eps_low: float,
    eps_high: float,
    beta: float,
    kl_estimator: KLEstimator,
    aggregation: Aggregation,
    max_tokens: int | None = None,
    is_weight: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
    """[B, T] log-probs of the sampled tokens, [B] advantages -> (loss_sum, denom, metric sums).

    is_weight: [B, T] per-token weights of the policy loss (truncated_is_weight), None for none; the
    KL term is not weighted (as in verl). Metric sums are token sums (divide by the mask sum) so they
    accumulate across micro-batches."""
    per_token, clipped = clipped_surrogate(logp, old_logp, advantages, eps_low, eps_high)
    m = mask.astype(logp.dtype)
    metrics = {"clip_frac": (clipped * m).sum(), "tokens": m.sum()}
    if is_weight is not None:
        per_token = per_token * is_weight
        metrics["tis/weight"] = (is_weight * m).sum()
    if beta > 0:
        if ref_logp is None:
            raise ValueError("beta > 0 needs reference log-probs")
        kl = kl_penalty(logp, ref_logp, kl_estimator)
        per_token = per_token + beta * kl
        metrics["kl"] = (kl * m).sum()
    loss_sum, denom = aggregate(per_token, mask, aggregation, max_tokens)
    return loss_sum, denom, metrics
