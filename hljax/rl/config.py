"""Typed configs of the training concerns: loss, optimiser. Each knob where the literature
diverges is an explicit field, documented where it is declared (TRL's name in brackets)."""

from __future__ import annotations

import dataclasses
import typing
from typing import Literal

from hljax.config import DERIVED

# The knobs' values, here rather than beside the maths in grpo.py (which imports them): config files
# read this module, and they load without JAX.
KLEstimator = Literal["k1", "k2", "k3"]
Aggregation = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "dr_grpo"]
StdScaling = Literal["group", "batch", "none"]
ZeroVarianceGroups = Literal["keep", "drop"]
AGGREGATIONS = typing.get_args(Aggregation)


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """What one train step minimises."""

    # The trainer sets mode (and temperature, below) per stage: not config keys.
    mode: Literal["grpo", "sft"] = dataclasses.field(default="grpo", metadata={DERIVED: True})
    # Clip range [1 - eps_low, 1 + eps_high] of the importance ratio [epsilon, epsilon_high]. eps_high
    # None means eps_low (symmetric PPO clip); DAPO's clip-higher uses 0.28 with eps_low 0.2.
    eps_low: float = 0.2
    eps_high: float | None = None  # Upper clip of the ratio, 1 + eps_high (DAPO's clip-higher); None = eps_low.
    # KL to the frozen reference [beta]: the policy GRPO starts from (after SFT, the SFT proposer).
    # 0 skips the reference model entirely (DAPO, Dr. GRPO).
    beta: float = 0.0
    kl_estimator: KLEstimator = "k3"  # k1 | k2 | k3 (Schulman 2020); GRPO uses k3.
    # token_mean (DAPO, TRL "dapo") | seq_mean_token_mean (original GRPO, TRL "grpo") |
    # seq_mean_token_sum | dr_grpo (token sum / (B * max_tokens), TRL "dr_grpo").
    aggregation: Aggregation = "token_mean"
    max_tokens: int | None = None  # The generation budget; required by dr_grpo.
    # Advantage scaling [scale_rewards]: group std (GRPO) | batch std | none (Dr. GRPO).
    std_scaling: StdScaling = "group"
    # 1: the sample std, torch.std's default, as TRL 1.16, verl and Tunix compute it; 0: the population
    # std (numpy's default), sqrt(G / (G - 1)) larger advantages (1.069x at G = 8).
    std_ddof: int = 1
    adv_eps: float = 1e-4  # Added to the std before dividing.
    # Groups whose G rewards are all equal have advantage 0 and no policy gradient. keep: they stay in
    # the batch (TRL, the original GRPO), so they count in token_mean's denominator and the KL term;
    # drop: their loss mask is 0, like a group hit by an infrastructure error (DAPO's dynamic sampling
    # without the resampling: the step trains on fewer groups). Counted either way (groups/zero_variance).
    zero_variance_groups: ZeroVarianceGroups = "keep"
    # Truncated importance sampling against the sampler [vllm_importance_sampling_cap]: each token's policy
    # loss is weighted by min(pi_old / pi_sampler, tis_cap), pi_old the trainer's log-prob before the
    # update and pi_sampler the rollout server's (verl's tis_imp_ratio_cap, slime's TIS; 2 is the usual
    # cap). It corrects for a sampler whose numerics differ from the trainer's (a bf16 SGLang server and
    # an fp32 trainer). Needs the sampler's log-probs of the same distribution (same temperature, no
    # top-p/top-k truncation). None or 0: off.
    tis_cap: float | None = None
    # Log-probs are those of the sampling distribution, log_softmax(logits / temperature): GRPO's
    # grpo.temperature, 1 for SFT.
    temperature: float = dataclasses.field(default=1.0, metadata={DERIVED: True})
    logprob_chunk: int = 256  # Sequence chunk for the vocabulary projection (memory vs speed).

    def __post_init__(self):
        if self.eps_high is None:
            object.__setattr__(self, "eps_high", self.eps_low)
        if not self.tis_cap:
            object.__setattr__(self, "tis_cap", None)  # 0 (a command line's "off") is None.
        elif self.tis_cap < 0:
            raise ValueError(f"tis_cap must be > 0 (or 0 / None for off), got {self.tis_cap}")
        if self.zero_variance_groups not in typing.get_args(ZeroVarianceGroups):
            raise ValueError(f"zero_variance_groups {self.zero_variance_groups!r} is not one of keep, drop")
        if self.std_ddof not in (0, 1):
            raise ValueError(f"std_ddof must be 0 or 1, got {self.std_ddof}")
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation {self.aggregation!r} is not one of {AGGREGATIONS}")
        if self.aggregation == "dr_grpo" and not self.max_tokens:
            raise ValueError("aggregation 'dr_grpo' needs max_tokens (the generation budget)")
        if self.kl_estimator not in ("k1", "k2", "k3"):
            raise ValueError(f"kl_estimator {self.kl_estimator!r} is not one of k1, k2, k3")
        if self.std_scaling not in ("group", "batch", "none"):
            raise ValueError(f"std_scaling {self.std_scaling!r} is not one of group, batch, none")
        if self.beta < 0 or self.temperature <= 0 or self.eps_low < 0 or self.eps_high < 0:
            raise ValueError(f"beta, eps_low, eps_high must be >= 0 and temperature > 0: {self}")


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """AdamW with linear warmup then cosine decay, global-norm clipping."""

    learning_rate: float = 1e-6  # Peak learning rate.
    warmup_steps: int = 0  # Linear warm-up from 0 to learning_rate.
    decay_steps: int = 1000  # Cosine decay length after warmup.
    final_lr_ratio: float = 0.1  # LR at the end of the decay, relative to learning_rate.
    b1: float = 0.9  # Adam's first-moment decay.
    b2: float = 0.999  # Adam's second-moment decay.
    eps: float = 1e-8  # Adam's denominator epsilon.
    weight_decay: float = 0.0  # Decoupled (AdamW) weight decay.
    max_grad_norm: float = 1.0  # 0 disables clipping.
