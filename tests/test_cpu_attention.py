"""The CPU attention kernel (hljax/kernels/cpu_attention.cc), forward and gradient, against torch in
float64 and a model with it against transformers (its GRPO step on shared prompts against torch:
tests/test_shared_prompts.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from hljax import sharding as shd
from hljax.checkpoint import hf
from hljax.kernels import cpu_attention, cpu_decode

UNAVAILABLE = cpu_decode.availability()
needs_kernels = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"CPU kernels unavailable: {UNAVAILABLE}")


def _torch_reference(q, k, v, mask, scale, w):
    """float64 attention by its definition and the gradients of sum(out * w): a query that keeps no
    key gives 0, as the kernel does."""
    q, k, v = (torch.tensor(np.asarray(a), dtype=torch.float64, requires_grad=True) for a in (q, k, v))
    B, T, N, H = q.shape
    K = k.shape[1]
    kk = k.repeat_interleave(N // K, dim=1)  # [B, N, S, H]
    vv = v.repeat_interleave(N // K, dim=1)
    m = torch.tensor(np.asarray(mask))[:, None]  # [B, 1, T, S]
    s = torch.einsum("btnh,bnsh->bnts", q, kk) * scale
    p = torch.softmax(s.masked_fill(~m, -torch.inf), -1).nan_to_num(0.0)
    out = torch.einsum("bnts,bnsh->btnh", p, vv)
    (out * torch.tensor(np.asarray(w), dtype=torch.float64)).sum().backward()
    return [a.detach().numpy() for a in (out, q.grad, k.grad, v.grad)]


def _mask(kind, B, T, S, rng):
    if kind == "random":
        m = rng.random((B, T, S)) < 0.3
        m[0, 3] = False  # A query that keeps no key.
        return m
    m = np.tril(np.ones((T, S), bool), k=S - T)[None].repeat(B, 0)  # Causal, queries at the end.
    if kind == "padded":
        m[0, :, :11] = False  # Left padding: the first rows keep no key at all.
        m[-1, :, S - 5 :] = False
    return m


@needs_kernels
@pytest.mark.parametrize("B,T,S,N,K,H,kind", [(2, 70, 70, 4, 2, 32, "causal"), (3, 130, 130, 8, 4, 64, "padded"),
                                              (2, 17, 150, 4, 2, 16, "random"), (1, 200, 200, 2, 2, 64, "causal"),
                                              (2, 33, 97, 6, 2, 32, "padded"), (1, 64, 64, 1, 1, 128, "causal")])
def test_attention_and_its_gradient_equal_torch_float64(B, T, S, N, K, H, kind):
    rng = np.random.default_rng(B * T + S + N + H)
    q = jnp.asarray(rng.normal(size=(B, T, N, H)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(B, K, S, H)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(B, K, S, H)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(B, T, N, H)), jnp.float32)
    mask = jnp.asarray(_mask(kind, B, T, S, rng))
    scale = H**-0.5

    def loss(q, k, v):
        return jnp.sum(cpu_attention.attention(q, k, v, mask, scale) * w)

    out = jax.jit(cpu_attention.attention, static_argnums=4)(q, k, v, mask, scale)
    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    for got, want, name in zip((out, *grads), _torch_reference(q, k, v, mask, scale, w), ("out", "dq", "dk", "dv")):
        np.testing.assert_allclose(np.asarray(got), want, atol=2e-5 * np.abs(want).max(), err_msg=name)


@needs_kernels
@pytest.mark.parametrize("cache_dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("B,T,N,K,H,kind", [(2, 70, 4, 2, 32, "causal"), (3, 130, 8, 4, 64, "padded"),
                                            (1, 5, 6, 1, 16, "padded"), (2, 64, 16, 8, 128, "causal")])
def test_prefill_attention_equals_torch_float64_and_writes_the_cache_layout(B, T, N, K, H, kind, cache_dtype):
    """The engine's prefill kernel: k and v as projected ([B, T, K, H]), the cache [B, K, T, H] written
    exactly, bf16 rounded to nearest even (ml_dtypes' cast, not XLA's)."""
    rng = np.random.default_rng(B * T + N + H)
    q = rng.normal(size=(B, T, N, H)).astype(np.float32)
    k = rng.normal(size=(B, T, K, H)).astype(np.float32)
    v = rng.normal(size=(B, T, K, H)).astype(np.float32)
    k[0, 0, 0, :3] = [1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8 + 2**-20)]  # bf16 ties to even, and a non-tie.
    mask = _mask(kind, B, T, T, rng)
    scale = H**-0.5
    out, k_cache, v_cache = jax.jit(lambda *a: cpu_attention.prefill(*a, scale, cache_dtype))(q, k, v, mask)
    head_major = lambda x: x.transpose(0, 2, 1, 3)  # noqa: E731
    want = _torch_reference(q, head_major(k), head_major(v), mask, scale, np.zeros_like(q))[0]
    np.testing.assert_allclose(np.asarray(out), want, atol=2e-5 * np.abs(want).max())
    for got, x in ((k_cache, k), (v_cache, v)):
        assert got.dtype == cache_dtype and got.shape == (B, K, T, H)
        np.testing.assert_array_equal(np.asarray(got).view(np.uint8), head_major(x).astype(cache_dtype).view(np.uint8))


@needs_kernels
def test_prefill_attention_refuses_mismatched_shapes():
    q = jnp.zeros((1, 8, 4, 16))
    k = jnp.zeros((1, 8, 2, 16))
    with pytest.raises(Exception, match=r"hljax_prefill_attention: want q \[B, T, N, H\], k and v \[B, T, K, H\]"):
        jax.block_until_ready(cpu_attention.prefill(q, k, k, jnp.ones((1, 8, 9), bool), 0.25, jnp.float32))
    with pytest.raises(cpu_decode.KernelUnavailable, match="head_dim 20 is not a multiple"):
        cpu_attention.prefill(jnp.zeros((1, 8, 4, 20)), jnp.zeros((1, 8, 2, 20)), jnp.zeros((1, 8, 2, 20)),
                              jnp.ones((1, 8, 8), bool), 0.25, jnp.float32)


def _qwen3(path, kernel):
    return hf.load_hf(path, shd.single_device_mesh(), attention_kernel=kernel)


@needs_kernels
def test_a_model_with_the_kernel_equals_transformers_and_its_gradient_equals_xlas(tiny_h32):
    rng = np.random.default_rng(0)
    B, T = 3, 150  # More than one key tile, and left padding in two rows.
    tokens = rng.integers(3, 160, (B, T))
    attention_mask = np.ones((B, T), np.int32)
    attention_mask[1, :40] = 0
    attention_mask[2, :7] = 0
    positions = np.maximum(np.cumsum(attention_mask, axis=1) - 1, 0)
    ref = transformers.AutoModelForCausalLM.from_pretrained(tiny_h32, attn_implementation="eager").eval()
    with torch.no_grad():
        want = ref(torch.tensor(tokens), attention_mask=torch.tensor(attention_mask),
                   position_ids=torch.tensor(positions)).logits.numpy()
    on, off = _qwen3(tiny_h32, True), _qwen3(tiny_h32, False)
    assert on.cfg.attention_kernel and not off.cfg.attention_kernel
    got = np.asarray(on(jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(attention_mask)))
    real = attention_mask.astype(bool)
    np.testing.assert_allclose(got[real], want[real], rtol=1e-4, atol=1e-4 * np.abs(want).max())

    def loss_of(model):
        from flax import nnx

        graph, state = nnx.split(model)

        def loss(state):
            logits = nnx.merge(graph, state)(jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(attention_mask))
            logp = jax.nn.log_softmax(logits[:, :-1], -1)
            picked = jnp.take_along_axis(logp, jnp.asarray(tokens)[:, 1:, None], -1)[..., 0]
            # Real positions predicting real tokens: a padding position's output is 0 here, v's mean in XLA.
            return -jnp.sum(picked * jnp.asarray(attention_mask[:, 1:] * attention_mask[:, :-1]))

        return jax.jit(jax.value_and_grad(loss))(state)

    (l_on, g_on), (l_off, g_off) = loss_of(on), loss_of(off)
    np.testing.assert_allclose(float(l_on), float(l_off), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(g_on), jax.tree.leaves(g_off)):
        a, b = np.asarray(a), np.asarray(b)
        np.testing.assert_allclose(a, b, atol=1e-4 * max(np.abs(b).max(), 1e-6))


@needs_kernels
def test_resolve_says_when_and_why_the_kernel_is_not_used():
    assert cpu_attention.resolve("off", jnp.float32, 64, 1) is False
    assert cpu_attention.resolve("auto", jnp.float32, 64, 1) is True
    assert cpu_attention.resolve("auto", jnp.float32, 64, 8) is False  # The call is not partitioned.
    assert cpu_attention.resolve("auto", jnp.bfloat16, 64, 1) is False
    with pytest.raises(cpu_decode.KernelUnavailable, match="fp32 only"):
        cpu_attention.resolve("on", jnp.bfloat16, 64, 1)
    with pytest.raises(cpu_decode.KernelUnavailable, match="head_dim 20 is not a multiple"):
        cpu_attention.resolve("on", jnp.float32, 20, 1)
    with pytest.raises(cpu_decode.KernelUnavailable, match="8 devices"):
        cpu_attention.resolve("on", jnp.float32, 64, 8)


def test_an_unknown_mode_is_a_config_error():
    from hljax.config import ConfigError, ModelSpec, typed

    with pytest.raises(ConfigError, match="attention_kernel"):
        typed(ModelSpec, {"attention_kernel": "yes"}, "config.model")


@needs_kernels
def test_launch_train_with_attention_kernel_on_trains_through_it(tmp_path):
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    argv = [sys.executable, "-m", "launch.train", "--config", os.path.join(root, "configs/tiny.py"),
            f"--config.run_dir={tmp_path / 'run'}", "--config.mode=sft", "--config.sft.steps=2",
            "--config.sft.eval_rows=0", "--config.model.attention_kernel=on", "--config.metrics.backends=('jsonl',)"]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # One device: the kernel call is not partitioned.
    out = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "attention: hljax CPU kernel" in out.stdout + out.stderr
