"""Supervised fine-tuning loss: cross-entropy on completion tokens only."""

from __future__ import annotations

import jax


def masked_cross_entropy(logp: jax.Array, loss_mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """logp: [B, T] log-probs of the targets; loss_mask: [B, T] -> (loss_sum, denom), token mean."""
    m = loss_mask.astype(logp.dtype)
    return -(logp * m).sum(), m.sum()
