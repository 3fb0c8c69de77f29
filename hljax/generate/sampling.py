"""Token sampling: temperature, top-k, top-p, per-row seeds. Pure functions of arrays."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def row_keys(seeds: jax.Array, step: jax.Array) -> jax.Array:
    """seeds: [B] uint32, step: scalar or [B] (each row's own step) -> [B] keys. A row's randomness
    depends on its seed and step only, never on its batch neighbours or when it joined the batch, so
    the same seed gives the same tokens in any batch."""
    steps = jnp.broadcast_to(jnp.asarray(step, jnp.int32), seeds.shape)
    return jax.vmap(lambda s, t: jax.random.fold_in(jax.random.key(s), t))(seeds, steps)


def mask_tokens(logits: jax.Array, token_ids: jax.Array, active: jax.Array) -> jax.Array:
    """logits: [B, V]; token_ids: [B, K] (-1 = none); active: [B] bool -> logits with those ids at -inf
    in the active rows: `min_new_tokens` forbids the stop tokens until enough have been generated (as
    SGLang and transformers do, so the reported logprobs are of the distribution sampled from)."""
    B, V = logits.shape
    ids = jnp.where(active[:, None] & (token_ids >= 0), token_ids, V)  # V is out of range: dropped.
    return logits.at[jnp.arange(B)[:, None], ids].set(-jnp.inf, mode="drop")


def token_logprobs(logits: jax.Array, temperature: jax.Array) -> jax.Array:
    """logits: [B, V]; temperature: [B] -> log_softmax(logits / T) [B, V] in fp32 (T = 0 counts as 1).

    The full-vocabulary convention SGLang reports, before any top-k/top-p truncation."""
    t = jnp.where(temperature > 0, temperature, 1.0).astype(jnp.float32)
    return jax.nn.log_softmax(logits.astype(jnp.float32) / t[:, None], axis=-1)


def filter_top_k_top_p(logprobs: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    """logprobs: [B, V]; top_k: [B] int (-1 = off); top_p: [B] -> logprobs with dropped tokens at -inf.

    top-p keeps the smallest prefix of tokens, by descending probability, whose mass reaches top_p
    (the token that crosses the threshold is kept); top-k then keeps at most k of them."""
    V = logprobs.shape[-1]
    order = jnp.argsort(-logprobs, axis=-1)  # [B, V]
    sorted_lp = jnp.take_along_axis(logprobs, order, axis=-1)
    probs = jnp.exp(sorted_lp)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    rank = jnp.arange(V)[None, :]
    keep = (mass_before < top_p[:, None]) & ((top_k[:, None] < 0) | (rank < top_k[:, None]))
    keep = keep | (rank == 0)  # Never drop the most likely token.
    kept_sorted = jnp.where(keep, sorted_lp, -jnp.inf)
    inverse = jnp.argsort(order, axis=-1)
    return jnp.take_along_axis(kept_sorted, inverse, axis=-1)


def sample(
    logits: jax.Array,
    keys: jax.Array,
    temperature: jax.Array,
    top_k: jax.Array,
    top_p: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """logits: [B, V]; keys: [B]; temperature, top_p: [B] float; top_k: [B] int
    -> (tokens [B] int32, logprobs of those tokens under log_softmax(logits / T) [B] fp32).

    temperature 0 is greedy. The full sort that top-k/top-p need runs only when a row asks for it."""
    logprobs = token_logprobs(logits, temperature)
    greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32)

    def draw(lp):
        needs_filter = jnp.any((top_k > 0) | (top_p < 1.0))
        lp = jax.lax.cond(needs_filter, filter_top_k_top_p, lambda x, k, p: x, lp, top_k, top_p)
        return jax.vmap(jax.random.categorical)(keys, lp).astype(jnp.int32)

    # An all-greedy batch skips the random draw over the vocabulary, which costs as much as the argmax.
    drawn = jax.lax.cond(jnp.any(temperature > 0), draw, lambda lp: greedy, logprobs)
    tokens = jnp.where(temperature > 0, drawn, greedy)
    return tokens, jnp.take_along_axis(logprobs, tokens[:, None], axis=-1)[:, 0]
