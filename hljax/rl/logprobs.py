"""Per-token log-probs and entropies without materialising [B, T, V] logits.

The final hidden states are projected to the vocabulary in sequence chunks under `jax.checkpoint`,
so forward and backward hold one [B, C, V] chunk at a time (Qwen's vocabulary is 151k).
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from hljax.models.ops import project
from hljax.models.qwen3 import Qwen3


@flax.struct.dataclass
class Sequences:
    """Prompt + completion, right-padded. Position t predicts token t + 1."""

    tokens: jax.Array  # [B, L] int32
    attention_mask: jax.Array  # [B, L] int32: 1 on real tokens
    loss_mask: jax.Array  # [B, L] fp32: 1 where token t + 1 is a completion token (the targets)


@flax.struct.dataclass
class Prefix:
    """A prompt prefix shared by G consecutive rows of a `Sequences` (a GRPO group's prompt but its
    last token), run through the model once for the group; those rows then hold only the rest."""

    tokens: jax.Array  # [P, Lp] int32, LEFT-padded; row r of the Sequences continues prefix r // G
    attention_mask: jax.Array  # [P, Lp] int32: 1 on real tokens


def _chunk_logprobs(h: jax.Array, w: jax.Array, vocab_major: bool, targets: jax.Array, temperature: float):
    """h: [B, C, D], w: the output projection (see ops.project), targets: [B, C] -> (logp, entropy) [B, C]."""
    logits = project(h, w, vocab_major) / temperature  # [B, C, V] fp32
    lse = jax.nn.logsumexp(logits, axis=-1)
    logp = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0] - lse
    probs = jnp.exp(logits - lse[..., None])
    entropy = lse - jnp.sum(probs * logits, axis=-1)
    return logp, entropy


def sequence_logprobs(
    model: Qwen3, seqs: Sequences, *, temperature: float = 1.0, chunk: int = 256, masked_only: bool = False,
    prefix: Prefix | None = None,
) -> tuple[jax.Array, jax.Array]:
    """-> (logp [B, L], entropy [B, L]) of token t + 1 at position t, under log_softmax(logits / T).

    The last position has no target and gets 0.
    masked_only: chunks where no row has a loss_mask position skip the vocabulary projection and
    give 0 (for losses and old log-probs, which read only loss_mask positions: a long prompt's
    chunks then cost no [B, C, V] logits).
    prefix: `seqs` continue these shared prefixes (`Prefix`); positions count from the prefix's end."""
    B, L = seqs.tokens.shape
    if prefix is None:
        positions = jnp.maximum(jnp.cumsum(seqs.attention_mask, axis=1) - 1, 0)
        h = model.hidden_states(seqs.tokens, positions, seqs.attention_mask)  # [B, L, D]
    else:
        h = model.shared_prefix_hidden_states(prefix.tokens, prefix.attention_mask, seqs.tokens, seqs.attention_mask)
    targets = jnp.concatenate([seqs.tokens[:, 1:], jnp.zeros((B, 1), seqs.tokens.dtype)], axis=1)
    loss_mask = seqs.loss_mask
    if masked_only:
        # Chunks start at the first position any row reads, so that a prompt's positions fill no chunk
        # that must run for a few completion positions (torch's `logits_to_keep` does the same work).
        start = jnp.argmax((loss_mask > 0).any(axis=0))
        h, targets, loss_mask = (jnp.roll(a, -start, axis=1) for a in (h, targets, loss_mask))
    C = min(chunk, L)
    n = -(-L // C)
    if n * C != L:  # Pad to whole chunks; the padding's log-probs are cut off below.
        pad = ((0, 0), (0, n * C - L))
        h, targets, loss_mask = jnp.pad(h, (*pad, (0, 0))), jnp.pad(targets, pad), jnp.pad(loss_mask, pad)
    hc = h.reshape(B, n, C, -1).swapaxes(0, 1)  # [n, B, C, D]
    tc = targets.reshape(B, n, C).swapaxes(0, 1)
    w, vocab_major = model.head_weight(), model.cfg.tie_word_embeddings
    step = jax.checkpoint(lambda hh, tt: _chunk_logprobs(hh, w, vocab_major, tt, temperature))
    if masked_only:
        needed = (loss_mask.reshape(B, n, C) > 0).any(axis=(0, 2))  # [n]
        zeros = jnp.zeros((B, C), jnp.float32)
        logp, ent = jax.lax.map(lambda xs: jax.lax.cond(xs[2], lambda: step(xs[0], xs[1]), lambda: (zeros, zeros)),
                                (hc, tc, needed))
    else:
        logp, ent = jax.lax.map(lambda xs: step(*xs), (hc, tc))  # [n, B, C]
    logp = logp.swapaxes(0, 1).reshape(B, n * C)[:, :L]
    ent = ent.swapaxes(0, 1).reshape(B, n * C)[:, :L]
    if masked_only:
        logp, ent = jnp.roll(logp, start, axis=1), jnp.roll(ent, start, axis=1)
    last = jnp.arange(L)[None, :] == L - 1
    return jnp.where(last, 0.0, logp), jnp.where(last, 0.0, ent)
