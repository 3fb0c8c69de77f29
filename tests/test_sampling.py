"""Sampling maths against analytic distributions computed independently in numpy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hljax.generate.sampling import filter_top_k_top_p, row_keys, sample

LOGITS = np.array([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0], np.float32)
N = 40_000


def analytic(logits, temperature, top_k, top_p):
    """Expected sampling distribution, by the definitions: sort, nucleus, top-k, renormalise."""
    p = np.exp(logits / temperature - np.max(logits / temperature))
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    keep = np.zeros_like(p, bool)
    mass = 0.0
    for rank, i in enumerate(order):
        if rank > 0 and (mass >= top_p or (top_k > 0 and rank >= top_k)):
            break
        keep[i] = True
        mass += p[i]
    q = np.where(keep, p, 0.0)
    return q / q.sum()


@pytest.mark.parametrize(
    "temperature,top_k,top_p",
    [(1.0, -1, 1.0), (0.5, -1, 1.0), (1.7, -1, 1.0), (1.0, 3, 1.0), (1.0, -1, 0.7), (0.8, 4, 0.9), (1.0, 1, 1.0)],
)
def test_empirical_distribution_matches_analytic(temperature, top_k, top_p):
    logits = jnp.broadcast_to(jnp.asarray(LOGITS), (N, LOGITS.size))
    keys = row_keys(jnp.arange(N, dtype=jnp.uint32), jnp.int32(0))
    full = lambda v, dt: jnp.full((N,), v, dt)  # noqa: E731
    tokens, logprobs = jax.jit(sample)(logits, keys, full(temperature, jnp.float32), full(top_k, jnp.int32),
                                       full(top_p, jnp.float32))
    empirical = np.bincount(np.asarray(tokens), minlength=LOGITS.size) / N
    expected = analytic(LOGITS, temperature, top_k, top_p)
    tv = 0.5 * np.abs(empirical - expected).sum()
    assert tv < 0.015, (empirical, expected)
    assert np.all(empirical[expected == 0] == 0), "sampled a token that top-k/top-p excludes"
    # Reported logprobs are the full-vocabulary log_softmax(logits / T), before truncation.
    lsm = LOGITS / temperature - np.log(np.exp(LOGITS / temperature).sum())
    np.testing.assert_allclose(np.asarray(logprobs), lsm[np.asarray(tokens)], rtol=1e-5, atol=1e-5)


def test_greedy_and_its_logprob():
    logits = jnp.asarray(np.stack([LOGITS, LOGITS[::-1]]))
    keys = row_keys(jnp.asarray([1, 2], jnp.uint32), jnp.int32(5))
    tokens, logprobs = sample(logits, keys, jnp.zeros(2), jnp.full(2, -1), jnp.ones(2))
    assert np.asarray(tokens).tolist() == [0, 7]
    lsm = LOGITS - np.log(np.exp(LOGITS).sum())
    np.testing.assert_allclose(np.asarray(logprobs), [lsm[0], lsm[0]], rtol=1e-6)


def test_filter_keeps_nucleus_by_hand():
    # probs 0.5, 0.3, 0.15, 0.05: top_p=0.75 keeps the first two (0.5 < 0.75, 0.8 >= 0.75 stops after it).
    lp = jnp.log(jnp.asarray([[0.15, 0.5, 0.05, 0.3]]))
    out = np.asarray(filter_top_k_top_p(lp, jnp.asarray([-1]), jnp.asarray([0.75])))
    assert np.isfinite(out).tolist() == [[False, True, False, True]]
    out = np.asarray(filter_top_k_top_p(lp, jnp.asarray([3]), jnp.asarray([1.0])))
    assert np.isfinite(out).tolist() == [[True, True, False, True]]


def test_row_keys_depend_on_seed_and_step_only():
    a = row_keys(jnp.asarray([7, 8], jnp.uint32), jnp.int32(3))
    b = row_keys(jnp.asarray([9, 7], jnp.uint32), jnp.int32(3))
    assert np.array_equal(jax.random.key_data(a[0]), jax.random.key_data(b[1]))
    c = row_keys(jnp.asarray([7], jnp.uint32), jnp.int32(4))
    assert not np.array_equal(jax.random.key_data(a[0]), jax.random.key_data(c[0]))
