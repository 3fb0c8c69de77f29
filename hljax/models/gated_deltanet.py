"""Gated DeltaNet (Yang et al. 2024) maths as pure functions: the causal depthwise conv, and the gated
delta rule in a chunked parallel form (training, prefill) and a recurrent form (decode).

Shapes: B batch, T length, C conv channels, W conv width, Hk / Hv key / value heads,
Dk / Dv key / value head dim, N number of chunks, L chunk length.

The recurrence, per value head, with state S [Dk, Dv], decay a_t = exp(g_t) and rate beta_t:
    S_t = a_t S_{t-1} + beta_t k_t (v_t - a_t S_{t-1}^T k_t)^T        o_t = S_t^T q_t
The chunked form computes the same thing L tokens at a time (the WY / UT-transform trick: one
triangular inverse per chunk turns L rank-one updates into matmuls), so the two agree to rounding.
Both take q and k already L2-normalised, q scaled by Dk^-0.5 and repeated to Hv heads
(`prepare_qk`), and compute in fp32 whatever the input dtype, as transformers' reference does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_L2_EPS = 1e-6  # transformers' `l2norm` eps (FLA's value).


def causal_conv(x: jax.Array, w: jax.Array, state: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Depthwise causal conv1d over time, continuing from `state`, followed by SiLU.

    x: [B, T, C]; w: [W, C], tap j weighing the input W - 1 - j steps back (w[W - 1]: the current
    token; HF's conv1d weight [C, 1, W] transposed); state: [B, W - 1, C], the W - 1 inputs before x (zeros at the start of a sequence)
    -> (y [B, T, C], new state [B, W - 1, C]: the last W - 1 inputs of state ++ x).
    """
    W, T = w.shape[0], x.shape[1]
    full = jnp.concatenate([state.astype(x.dtype), x], axis=1)  # [B, W - 1 + T, C]
    # A handful of shifted multiply-adds: W is tiny (4), so this beats a general conv on every backend.
    y = sum(full[:, j : j + T] * w[j].astype(x.dtype) for j in range(W))
    return jax.nn.silu(y), full[:, T:]


def l2norm(x: jax.Array, eps: float = _L2_EPS) -> jax.Array:
    """x / sqrt(sum(x^2) + eps) over the last axis (transformers' form, eps inside the root)."""
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def prepare_qk(q: jax.Array, k: jax.Array, num_v_heads: int) -> tuple[jax.Array, jax.Array]:
    """q, k: [B, T, Hk, Dk] -> fp32 [B, T, Hv, Dk]: L2-normalised, q scaled by Dk^-0.5, each key head
    repeated for the Hv // Hk consecutive value heads it serves."""
    q, k = l2norm(q.astype(jnp.float32)), l2norm(k.astype(jnp.float32))
    q = q * (q.shape[-1] ** -0.5)
    rep = num_v_heads // q.shape[2]
    return jnp.repeat(q, rep, axis=2), jnp.repeat(k, rep, axis=2)


def recurrent(q, k, v, g, beta, state):
    """Token-by-token gated delta rule.

    q, k: [B, T, Hv, Dk] (prepared); v: [B, T, Hv, Dv]; g (log decay, <= 0), beta: [B, T, Hv];
    state: [B, Hv, Dk, Dv] -> (o [B, T, Hv, Dv] fp32, final state [B, Hv, Dk, Dv] fp32).
    """
    f32 = lambda x: jnp.moveaxis(x.astype(jnp.float32), 1, 0)  # noqa: E731  time first for scan

    def step(S, inputs):
        q_t, k_t, v_t, g_t, b_t = inputs  # [B, Hv, Dk], [B, Hv, Dk], [B, Hv, Dv], [B, Hv], [B, Hv]
        S = S * jnp.exp(g_t)[..., None, None]
        delta = (v_t - jnp.einsum("bhk,bhkv->bhv", k_t, S)) * b_t[..., None]
        S = S + k_t[..., :, None] * delta[..., None, :]
        return S, jnp.einsum("bhk,bhkv->bhv", q_t, S)

    xs = tuple(f32(x) for x in (q, k, v, g, beta))
    if q.shape[1] == 1:  # Decode: one step, no loop inside the engine's decode while_loop.
        S, o = step(state.astype(jnp.float32), tuple(x[0] for x in xs))
        return o[:, None], S
    S, o = jax.lax.scan(step, state.astype(jnp.float32), xs)
    return jnp.moveaxis(o, 0, 1), S


def unit_lower_inverse(A: jax.Array) -> jax.Array:
    """A: [..., L, L] strictly lower triangular -> (I + A)^-1 [..., L, L].

    Blocked inversion by doubling (as LAPACK's trtri): from the inverses X11, X22 of two diagonal blocks,
    the inverse of [[L11, 0], [L21, L22]] is [[X11, 0], [-X22 L21 X11, X22]]. log2(L) levels of batched
    matmuls; L is padded to a power of two with an identity block, whose inverse is itself."""
    L = A.shape[-1]
    n = 1 << (L - 1).bit_length()
    batch = A.shape[:-2]
    A = jnp.pad(A, [(0, 0)] * len(batch) + [(0, n - L), (0, n - L)])
    inv = jnp.ones(batch + (n, 1, 1), A.dtype)  # the n unit 1 x 1 diagonal blocks
    b = 1
    while b < n:
        m = n // (2 * b)
        diag = jnp.moveaxis(jnp.diagonal(A.reshape(batch + (m, 2 * b, m, 2 * b)), axis1=-4, axis2=-2), -1, -3)
        x = inv.reshape(batch + (m, 2, b, b))
        x11, x22 = x[..., 0, :, :], x[..., 1, :, :]
        x21 = -(x22 @ diag[..., b:, :b] @ x11)
        top = jnp.concatenate([x11, jnp.zeros_like(x11)], axis=-1)
        inv = jnp.concatenate([top, jnp.concatenate([x21, x22], axis=-1)], axis=-2)  # [..., m, 2b, 2b]
        b *= 2
    return inv.reshape(batch + (n, n))[..., :L, :L]


def chunked(q, k, v, g, beta, state, chunk_size: int):
    """The same rule, `chunk_size` tokens per step of a scan over chunks. Same arguments and results as
    `recurrent`; T need not divide by chunk_size (the tail is zero-padded: g = beta = k = 0 leaves the
    state untouched, and the padded outputs are dropped)."""
    B, T, H, Dk = k.shape
    Dv = v.shape[-1]
    L = chunk_size
    pad = -T % L
    q, k, v, g, beta = (jnp.pad(x.astype(jnp.float32), [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
                        for x in (q, k, v, g, beta))
    N = (T + pad) // L

    def chunks(x):  # [B, T, H, ...] -> [N, B, H, L, ...]: chunk-major for the scan
        x = x.reshape(B, N, L, H, *x.shape[3:])
        return jnp.moveaxis(jnp.moveaxis(x, 1, 0), 3, 2)

    q, k, v, g, beta = (chunks(x) for x in (q, k, v, g, beta))
    cum = jnp.cumsum(g, axis=-1)  # [N, B, H, L] log decay from the chunk start to each token
    lower = jnp.tril(jnp.ones((L, L), bool))
    # decay[i, j] = exp(cum_i - cum_j) for j <= i; masked before exp so the upper triangle cannot overflow.
    decay = jnp.exp(jnp.where(lower, cum[..., :, None] - cum[..., None, :], -jnp.inf))  # [N, B, H, L, L]
    k_beta = k * beta[..., None]
    # (I + strictly_lower(A)) u = v beta and likewise w: the UT transform of L rank-one updates.
    A = jnp.where(lower & ~jnp.eye(L, dtype=bool), jnp.einsum("...ik,...jk->...ij", k_beta, k) * decay, 0.0)
    # An explicit inverse from matmuls rather than LAPACK's trsm: on XLA's CPU runtime each batched trsm
    # blocks a pool thread while it waits for its own tasks on that same pool, so two in flight at once
    # (the forward solve beside a backward one in a train step, or two right-hand sides) deadlock a
    # 2-thread pool: a 0%-CPU hang, gdb showing every tf_XLAEigen thread in ParallelBatchMap.
    rhs = jnp.concatenate([v * beta[..., None], k_beta * jnp.exp(cum)[..., None]], axis=-1)
    uw = unit_lower_inverse(A) @ rhs
    u, w = uw[..., :Dv], uw[..., Dv:]  # [N, B, H, L, Dv], [N, B, H, L, Dk]
    intra = jnp.einsum("...ik,...jk->...ij", q, k) * decay  # [N, B, H, L, L], diagonal included
    q_decayed = q * jnp.exp(cum)[..., None]
    k_to_end = k * jnp.exp(cum[..., -1:] - cum)[..., None]  # each key decayed to the chunk's end
    chunk_decay = jnp.exp(cum[..., -1])[..., None, None]  # [N, B, H, 1, 1]

    def step(S, c):
        u_c, w_c, q_c, k_c, intra_c, d_c = c
        v_new = u_c - jnp.einsum("bhlk,bhkv->bhlv", w_c, S)  # what the old state does not predict
        o = jnp.einsum("bhlk,bhkv->bhlv", q_c, S) + jnp.einsum("bhij,bhjv->bhiv", intra_c, v_new)
        S = S * d_c + jnp.einsum("bhlk,bhlv->bhkv", k_c, v_new)
        return S, o

    S, o = jax.lax.scan(step, state.astype(jnp.float32), (u, w, q_decayed, k_to_end, intra, chunk_decay))
    o = jnp.moveaxis(o, 0, 1).transpose(0, 1, 3, 2, 4).reshape(B, N * L, H, Dv)  # [B, T + pad, H, Dv]
    return o[:, :T], S
