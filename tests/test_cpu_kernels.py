"""The CPU decode kernels (hljax/kernels/cpu_decode.cc) against numpy and transformers."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from hljax import sharding as shd
from hljax.checkpoint import hf
from hljax.generate.engine import Engine, EngineConfig, Request
from hljax.generate.steps import decode_chunk
from hljax.generate.types import SamplingParams
from hljax.kernels import cpu_decode
from hljax.mesh import MeshConfig
from hljax.models import ops
from flax import nnx
from tests import tiny, tiny_qwen3_5

UNAVAILABLE = cpu_decode.availability()
needs_kernels = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"CPU kernels unavailable: {UNAVAILABLE}")
needs_amx = pytest.mark.skipif(not cpu_decode.amx(), reason="cpu_decode.amx() is False: no amx_bf16 in "
                               "/proc/cpuinfo, the AVX2 build, or no kernels")
needs_avx512_bf16 = pytest.mark.skipif(not cpu_decode.avx512_bf16(), reason="cpu_decode.avx512_bf16() is False: "
                                       "no avx512_bf16 in /proc/cpuinfo, the AVX2 build, or no kernels")
# The bf16 products of a prefill's rows, each where this CPU has it.
BF16_KERNELS = {"amx": (needs_amx, cpu_decode.matmul_packed_amx),
                "avx512_bf16": (needs_avx512_bf16, cpu_decode.matmul_packed_bf16dot)}


@needs_kernels
@pytest.mark.parametrize("M,K,N", [(1, 64, 48), (3, 33, 47), (8, 1000, 97), (9, 17, 49), (16, 128, 300), (5, 7, 1),
                                   (40, 70, 50)])
def test_packed_matmul_equals_numpy(M, K, N):
    rng = np.random.default_rng(M * 1000 + K + N)
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = rng.standard_normal((K, N)).astype(np.float32)
    got = np.asarray(jax.jit(lambda x, w: cpu_decode.matmul_packed(x, cpu_decode.pack(w), N))(x, w))
    want = x.astype(np.float64) @ w.astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def _bf16(a):
    """bf16 array and its exact fp64 value."""
    b = jnp.asarray(a, jnp.bfloat16)
    return b, np.asarray(b.astype(jnp.float32), np.float64)


@needs_kernels
@pytest.mark.parametrize("M,K,N", [(1, 64, 48), (3, 33, 47), (8, 1024, 300), (16, 128, 97)])
def test_bf16_packed_matmul_equals_numpy_on_the_rounded_weights(M, K, N):
    rng = np.random.default_rng(M + K + N)
    x = rng.standard_normal((M, K)).astype(np.float32)
    w, w64 = _bf16(rng.standard_normal((K, N)))
    got = np.asarray(jax.jit(lambda x, w: cpu_decode.matmul_packed(x, cpu_decode.pack(w), N))(x, w))
    want = x.astype(np.float64) @ w64  # Widening bf16 is exact: only fp32 accumulation error is left.
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    assert cpu_decode.pack(w).dtype == jnp.bfloat16  # Packing keeps the halved bytes.


@needs_kernels
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("M,K,N", [(1, 64, 4), (3, 33, 7), (8, 1024, 301), (16, 40, 64)])
def test_row_matmul_equals_numpy(M, K, N, dtype):
    rng = np.random.default_rng(M + K + N)
    x = rng.standard_normal((M, K)).astype(np.float32)
    e = jnp.asarray(rng.standard_normal((N, K)), dtype)
    got = np.asarray(jax.jit(cpu_decode.matmul_nt)(x, e))
    want = x.astype(np.float64) @ np.asarray(e.astype(jnp.float32), np.float64).T
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@needs_kernels
@pytest.mark.parametrize("extra", [2, 0])
def test_pack_layout_is_column_panels_then_a_narrow_one(extra):
    """Full panels [K, P], then the last `extra` columns as a [K, extra] panel and P - extra zeros: the
    weights' own elements plus less than one panel row, not a zero-padded [K, P] panel."""
    P = cpu_decode.panel_width()
    w = np.arange(5 * (2 * P + extra), dtype=np.float32).reshape(5, 2 * P + extra)
    p = np.asarray(cpu_decode.pack(jnp.asarray(w)))
    assert p.shape == (w.size + (P - extra if extra else 0),)
    np.testing.assert_array_equal(p[: 5 * P].reshape(5, P), w[:, :P])
    np.testing.assert_array_equal(p[5 * P : 10 * P].reshape(5, P), w[:, P : 2 * P])
    np.testing.assert_array_equal(p[10 * P : 10 * P + 5 * extra].reshape(5, extra), w[:, 2 * P :])
    assert not p[10 * P + 5 * extra :].any()


@needs_kernels
@pytest.mark.parametrize("N", [96, 101])
def test_unpack_inverts_pack(N):
    w = jnp.asarray(np.random.default_rng(N).standard_normal((33, N)), jnp.bfloat16)
    np.testing.assert_array_equal(np.asarray(cpu_decode.unpack(cpu_decode.pack(w), 33, N, after=w)), np.asarray(w))


@pytest.mark.parametrize("kernel", [pytest.param(k, marks=m) for k, (m, _) in BF16_KERNELS.items()])
@pytest.mark.parametrize("M,K,N", [(16, 32, 96), (1, 64, 48), (17, 96, 101), (130, 64, 20), (33, 1000, 145),
                                   (128, 256, 192), (5, 7, 1), (11, 33, 49)])
def test_bf16_dot_packed_matmul_equals_numpy(M, K, N, kernel):
    """Rows and keys that do not fill a tile (a register strip, a key pair), narrow last panels, a lone
    last panel, one column."""
    rng = np.random.default_rng(M * 1000 + K + N)
    x, x64 = _bf16(rng.standard_normal((M, K)))
    w, w64 = _bf16(rng.standard_normal((K, N)))
    matmul = BF16_KERNELS[kernel][1]
    got = np.asarray(jax.jit(lambda x, w: matmul(x, cpu_decode.pack(w), N))(x, w))
    want = x64 @ w64
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def _calls(fn, *args) -> set[str]:
    """The custom calls in fn's lowered program."""
    return set(re.findall(r'custom_call @(\w+)', fn.lower(*args).as_text()))


ROUTES = ["fma", "xla", pytest.param("amx", marks=needs_amx), pytest.param("avx512_bf16", marks=needs_avx512_bf16)]
ROUTE_CALL = {"fma": "hljax_matmul_packed", "xla": "hljax_unpack", "amx": "hljax_matmul_packed_amx",
              "avx512_bf16": "hljax_matmul_packed_bf16dot"}


def _as_route(monkeypatch, route: str) -> None:
    """This CPU as one with `route`'s bf16 products ("fma": no bf16 dots; "xla": bf16 dots but neither
    kernel, e.g. the AVX2 build)."""
    monkeypatch.setattr(cpu_decode, "bf16_dots", lambda: route != "fma")
    monkeypatch.setattr(cpu_decode, "amx", lambda: route == "amx")
    monkeypatch.setattr(cpu_decode, "avx512_bf16", lambda: route == "avx512_bf16")


@needs_kernels
@pytest.mark.parametrize("route", ROUTES)
def test_many_bf16_rows_take_the_bf16_dot_route_on_a_cpu_with_bf16_dots(monkeypatch, route):
    """A prefill's rows of a packed bf16 weight: on a CPU with bf16 dots, the product of the bf16-rounded
    activations, by the AMX kernel where there is AMX, else the AVX-512 BF16 one, else XLA's dot on the
    unpacked weight, each from its own number of rows; without bf16 dots the kernel on fp32 activations."""
    _as_route(monkeypatch, route)
    rng = np.random.default_rng(0)
    K, N, M = 64, 101, ops.BF16_DOT_ROWS
    w, w64 = _bf16(rng.standard_normal((K, N)))
    packed = nnx.Param(cpu_decode.pack(w), dense_in=1, packed_shape=(K, N))
    x = rng.standard_normal((2, M // 2, K)).astype(np.float32)
    fn = jax.jit(lambda x, p: ops.dense(x, nnx.Param(p, dense_in=1, packed_shape=(K, N))))
    want_call = {ROUTE_CALL[route]}
    assert _calls(fn, x, packed[...]) == want_call
    x64 = np.asarray(jnp.asarray(x, jnp.bfloat16).astype(jnp.float32), np.float64) if route != "fma" else x.astype(np.float64)
    want = x64 @ w64
    np.testing.assert_allclose(np.asarray(fn(x, packed[...])), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    few = jax.jit(lambda x, p: ops.dense(x, nnx.Param(p, dense_in=1, packed_shape=(K, N))))
    assert _calls(few, x[:, :3], packed[...]) == {"hljax_matmul_packed"}  # Decode's few rows: the kernel.
    first = {"amx": ops.AMX_ROWS, "avx512_bf16": ops.AVX512_BF16_ROWS, "xla": ops.BF16_DOT_ROWS}.get(route)
    if first is not None:  # From its own number of rows on (x is [2, rows / 2, K]).
        assert _calls(few, x[:, : first // 2], packed[...]) == want_call
        assert _calls(few, x[:, : first // 2 - 1], packed[...]) == {"hljax_matmul_packed"}


@needs_kernels
def test_the_bf16_dot_route_holds_one_layers_unpacked_weight_at_a_time(monkeypatch):
    """Eight layers through the route: each unpacked copy lives for its own product only (XLA's
    scheduler unpacked all eight at the program's start when the copy did not wait for its input)."""
    _as_route(monkeypatch, "xla")  # The route that unpacks.
    K = 20 * cpu_decode.panel_width()
    ws = [cpu_decode.pack(jnp.asarray(np.random.default_rng(i).standard_normal((K, K)) * 0.02, jnp.bfloat16))
          for i in range(8)]

    def layers(x, ws):
        for w in ws:
            x = jnp.tanh(ops.dense(x, nnx.Param(w, dense_in=1, packed_shape=(K, K))))
        return x

    x = jnp.ones((ops.BF16_DOT_ROWS, K), jnp.float32)
    temp = jax.jit(layers).lower(x, ws).compile().memory_analysis().temp_size_in_bytes
    assert temp < 3 * ws[0].nbytes, (temp, ws[0].nbytes)


def _attention_reference(q, k, v, valid, H):
    scores = np.einsum("bkgh,bksh->bkgs", q.astype(np.float64), k) * H**-0.5
    scores = np.where(valid[:, None, None, :], scores, -1e30)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    return np.einsum("bkgs,bksh->bkgh", p / p.sum(-1, keepdims=True), v)


@needs_kernels
@pytest.mark.parametrize("B,K,G,S,H", [(2, 2, 2, 7, 24), (8, 8, 2, 128, 128), (3, 1, 5, 33, 32), (1, 2, 9, 20, 256)])
def test_decode_attention_equals_numpy(B, K, G, S, H):
    rng = np.random.default_rng(B + K + G + S + H)
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for shape in ((B, K, G, H), (B, K, S, H), (B, K, S, H)))
    valid = rng.random((B, S)) < 0.7
    valid[0] = False  # A fully masked row: uniform weights, as the XLA path's -1e30 masking gives.
    got = np.asarray(jax.jit(lambda *a: cpu_decode.decode_attention(*a, S, H**-0.5))(q, k, v, valid))
    np.testing.assert_allclose(got, _attention_reference(q, k, v, valid, H), atol=2e-6)


@needs_kernels
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_decode_attention_reads_only_filled_slots(dtype):
    B, K, G, S, H, filled = 3, 2, 4, 64, 40, 21
    rng = np.random.default_rng(1)
    q = rng.standard_normal((B, K, G, H)).astype(np.float32)
    k, k64 = _bf16(rng.standard_normal((B, K, S, H))) if dtype == jnp.bfloat16 else (None, None)
    v, v64 = _bf16(rng.standard_normal((B, K, S, H))) if dtype == jnp.bfloat16 else (None, None)
    if dtype == jnp.float32:
        k64, v64 = rng.standard_normal((B, K, S, H)), rng.standard_normal((B, K, S, H))
        k, v = jnp.asarray(k64, jnp.float32), jnp.asarray(v64, jnp.float32)
        k64, v64 = np.asarray(k, np.float64), np.asarray(v, np.float64)
    valid = rng.random((B, S)) < 0.8
    valid[:, 0] = True
    # Slots past `filled` hold NaN and are marked valid: the kernel must not read them at all.
    k, v = (a.at[:, :, filled:].set(jnp.nan) for a in (k, v))
    got = np.asarray(jax.jit(lambda *a: cpu_decode.decode_attention(*a, H**-0.5))(q, k, v, valid, jnp.int32(filled)))
    want = _attention_reference(q, k64[:, :, :filled], v64[:, :, :filled], valid[:, :filled], H)
    np.testing.assert_allclose(got, want, atol=2e-6)


def _engines(path, **cfg):
    mesh = shd.single_device_mesh()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    on = Engine(hf.load_hf(path, mesh), mesh, EngineConfig(max_batch=8, max_seq_len=128, cpu_kernels="on", **cfg), tok)
    off = Engine(hf.load_hf(path, mesh), mesh, EngineConfig(max_batch=8, max_seq_len=128, cpu_kernels="off", **cfg), tok)
    return on, off


def _prompts(n=5, vocab=160, seed=0):
    rng = np.random.default_rng(seed)
    return [tuple(rng.integers(3, vocab, L).tolist()) for L in (5, 17, 9, 1, 30)[:n]]


@pytest.fixture(scope="module")
def untied_engines(tiny_untied):
    """(kernels on, kernels off) engines on the untied tiny Qwen3, shared by tests that do not swap weights."""
    return _engines(tiny_untied) if UNAVAILABLE is None else None


@needs_kernels
@pytest.mark.parametrize("tied", [False, True])
def test_kernel_decode_equals_xla_decode_and_transformers(tiny_untied, tiny_tied, untied_engines, tied):
    path = tiny_tied if tied else tiny_untied
    on, off = _engines(path) if tied else untied_engines
    assert on.kernels and not off.kernels
    prompts = _prompts()
    greedy = SamplingParams(max_new_tokens=20, temperature=0.0, stop_token_ids=())
    a = on.generate([Request(p, greedy) for p in prompts])
    b = off.generate([Request(p, greedy) for p in prompts])
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    # Sampled tokens' log-probs against transformers' teacher-forced ones on the same weights.
    ref = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    sp = SamplingParams(max_new_tokens=16, temperature=0.8, seed=3, stop_token_ids=())
    for p, o in zip(prompts, on.generate([Request(p, sp) for p in prompts])):
        ids = torch.tensor([list(p) + o.token_ids])
        with torch.no_grad():
            logits = ref(ids).logits[0, len(p) - 1 : -1].double()
        want = torch.log_softmax(logits / 0.8, -1)[torch.arange(len(o.token_ids)), torch.tensor(o.token_ids)]
        np.testing.assert_allclose(o.logprobs, want.numpy(), atol=1e-4)


@needs_kernels
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_prefill_attention_kernel_equals_xlas_prefill_and_transformers(tiny_h32, monkeypatch, dtype):
    """head_dim 32: the engine's prefill attends and writes its cache through the kernel, in fp32 as
    XLA's prefill does (the engine computes in fp32): same tokens, log-probs equal to 1e-5, and (fp32)
    equal to transformers'."""
    from hljax.generate import steps as eng

    mesh = shd.single_device_mesh()
    texts = []

    def spy(*args, fn=eng.prefill):
        texts.append(fn.lower(*args).as_text())
        return fn(*args)

    monkeypatch.setattr(eng, "prefill", spy)
    prompts = [tuple(np.random.default_rng(1).integers(3, 160, 70).tolist()), *_prompts()]  # Two key tiles.
    sp = SamplingParams(max_new_tokens=10, temperature=0.8, seed=3, stop_token_ids=())
    outs = []
    for kernel in (True, False):
        if not kernel:
            monkeypatch.setattr(ops, "prefill_kernel", lambda *a: False)
        engine = Engine(hf.load_hf(tiny_h32, mesh, dtype=dtype), mesh,
                        EngineConfig(max_batch=8, max_seq_len=128, cpu_kernels="on"))
        outs.append(engine.generate([Request(p, sp) for p in prompts]))
        assert texts and all(("hljax_prefill_attention" in t) == kernel for t in texts)
        texts.clear()
    a, b = outs
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    for x, y in zip(a, b):
        np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-5)
    if dtype == jnp.bfloat16:
        return
    ref = transformers.AutoModelForCausalLM.from_pretrained(tiny_h32, attn_implementation="eager").eval()
    for p, o in zip(prompts, a):
        ids = torch.tensor([list(p) + o.token_ids])
        with torch.no_grad():
            logits = ref(ids).logits[0, len(p) - 1 : -1].double()
        want = torch.log_softmax(logits / 0.8, -1)[torch.arange(len(o.token_ids)), torch.tensor(o.token_ids)]
        np.testing.assert_allclose(o.logprobs, want.numpy(), atol=1e-4)


@needs_kernels
def test_qwen3_5_kernel_decode_equals_xla_decode(tmp_path):
    path = tiny_qwen3_5.save(tmp_path / "q35")
    on, off = _engines(path)
    prompts = _prompts()
    sp = SamplingParams(max_new_tokens=16, temperature=0.7, seed=5, stop_token_ids=())
    a = on.generate([Request(p, sp) for p in prompts])
    b = off.generate([Request(p, sp) for p in prompts])
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    for x, y in zip(a, b):
        np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-5)


@needs_kernels
@pytest.mark.parametrize("route", ROUTES)
def test_bf16_kernel_engine_agrees_with_the_bf16_xla_engine(tiny_untied, monkeypatch, route):
    """bf16 weights, activations and cache: the kernels accumulate in fp32 where XLA's bf16 dot may
    round differently, so tokens agree for a while rather than exactly, and log-probs within bf16 noise.
    xla / amx / avx512_bf16: every product of the kernel engine as on a CPU with bf16 dots and a
    prefill's many rows (XLA's bf16 dot on the unpacked weight / our kernels on the packed one)."""
    _as_route(monkeypatch, route)
    for name in ("BF16_DOT_ROWS", "AMX_ROWS", "AVX512_BF16_ROWS"):
        monkeypatch.setattr(ops, name, 1)
    mesh = shd.single_device_mesh()
    engines = [Engine(hf.load_hf(tiny_untied, mesh, dtype=jnp.bfloat16), mesh,
                      EngineConfig(max_batch=8, max_seq_len=128, cpu_kernels=mode)) for mode in ("on", "off")]
    assert engines[0].kernels and not engines[1].kernels
    packed = [v for _, v in nnx.to_flat_state(engines[0]._params) if ops.packed_shape(v) is not None]
    assert packed and all(v[...].dtype == jnp.bfloat16 for v in packed)
    greedy = SamplingParams(max_new_tokens=12, temperature=0.0, stop_token_ids=())
    a, b = (e.generate([Request(p, greedy) for p in _prompts()]) for e in engines)
    agree = [next((i for i, (x, y) in enumerate(zip(o.token_ids, r.token_ids)) if x != y), 12) for o, r in zip(a, b)]
    assert sum(agree) >= 0.75 * 12 * len(agree), agree
    for o, r, n in zip(a, b, agree):
        np.testing.assert_allclose(o.logprobs[:n], r.logprobs[:n], atol=0.1)


@needs_kernels
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_kv_write_puts_each_row_at_its_slot_and_skips_slots_out_of_range(dtype):
    B, K, S, H = 4, 3, 10, 20
    rng = np.random.default_rng(7)
    cache = rng.standard_normal((B, K, S, H)).astype(np.float32)
    x = rng.standard_normal((B, K, H)).astype(np.float32)
    slots = np.array([0, 9, 10, -1], np.int32)  # The last two are out of range: nothing written.
    want = cache.copy()
    for b in range(2):
        want[b, :, slots[b]] = x[b]
    # Inside a jitted loop, as the decode loop calls it (the cache is the loop's carried buffer).
    step = jax.jit(lambda c, x, s: jax.lax.fori_loop(0, 2, lambda i, c: cpu_decode.kv_write(c, x, s), c))
    got = step(jnp.asarray(cache, dtype), jnp.asarray(x, dtype), jnp.asarray(slots))
    assert got.dtype == dtype
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(jnp.asarray(want, dtype), np.float32))


@needs_kernels
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_copy_rows_fills_each_destination_row_and_skips_rows_out_of_range(dtype):
    B, U, K, S, W, H = 5, 3, 2, 12, 7, 20
    rng = np.random.default_rng(11)
    dst = rng.standard_normal((B, K, S, H)).astype(np.float32)
    src = rng.standard_normal((U, K, W, H)).astype(np.float32)
    src_rows = np.array([2, 0, 2, 1, 0], np.int32)
    dst_rows = np.array([4, 1, 0, 5, -1], np.int32)  # The last two are out of range: nothing copied.
    want = dst.copy()
    for s_, d_ in zip(src_rows[:3], dst_rows[:3]):
        want[d_, :, :W] = src[s_]
    step = jax.jit(cpu_decode.copy_rows, donate_argnums=(0,))
    got = step(jnp.asarray(dst, dtype), jnp.asarray(src, dtype), jnp.asarray(src_rows), jnp.asarray(dst_rows))
    assert got.dtype == dtype
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(jnp.asarray(want, dtype), np.float32))


@needs_kernels
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_take_rows_equals_numpy_indexing(dtype):
    rng = np.random.default_rng(12)
    table = jnp.asarray(rng.standard_normal((50, 24)), dtype)
    ids = jnp.asarray([3, 49, 0, 3, 50, -1], jnp.int32)  # The last two are out of range: NaN rows.
    got = np.asarray(jax.jit(cpu_decode.take_rows)(table, ids))
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got[:4], np.asarray(table, np.float32)[[3, 49, 0, 3]])
    assert np.isnan(got[4:]).all()


@needs_kernels
def test_bf16_engine_programs_hold_no_table_or_cache_sized_temporaries(tiny_untied, monkeypatch):
    """XLA:CPU's bf16 gather and its row copies made temporaries the size of the embedding table (every
    decode chunk) and of R prefilled caches (every admission); the kernels read and write in place."""
    from hljax.generate import steps as eng

    mesh = shd.single_device_mesh()
    engine = Engine(hf.load_hf(tiny_untied, mesh, dtype=jnp.bfloat16), mesh,
                    EngineConfig(max_batch=8, max_seq_len=128, cpu_kernels="on"))
    compiled = {}
    for name in ("insert", "decode_chunk"):
        def spy(*args, fn=getattr(eng, name), name=name):
            compiled[name] = fn.lower(*args).compile()
            return fn(*args)

        monkeypatch.setattr(eng, name, spy)
    engine.generate([Request(p, SamplingParams(max_new_tokens=4, temperature=0.0)) for p in _prompts()] * 2)
    cfg = engine.model_config
    table = cfg.vocab_size * cfg.hidden_size * 2
    cache = 2 * cfg.num_layers * 8 * cfg.num_kv_heads * 32 * cfg.head_dim * 2  # 8 rows of 32 slots.
    assert set(compiled) == {"insert", "decode_chunk"}
    for name, c in compiled.items():
        # What is left is the sampler's few [B, V] fp32 arrays.
        assert c.memory_analysis().temp_size_in_bytes < min(table, cache), name
        text = c.as_text()
        assert ("hljax_copy_rows" in text) == (name == "insert")
        assert ("hljax_take_rows" in text) == (name == "decode_chunk")


@needs_kernels
def test_decode_program_calls_the_kernels_only_when_on(untied_engines):
    on, off = untied_engines

    for engine, want in ((on, True), (off, False)):
        graphdef, params = engine._graphdef, engine._params
        assert bool(engine.kernels) == want
        text = decode_chunk.lower(graphdef, params, engine.kernels, _state(engine), 4).as_text()
        assert ("hljax_matmul_packed" in text) == want
        assert ("hljax_decode_attention" in text) == want
        assert ("hljax_kv_write" in text) == want
        assert ("hljax_take_rows" in text) == want


@needs_kernels
def test_kernel_engine_holds_one_copy_of_the_weights(untied_engines):
    on, off = untied_engines
    bytes_of = lambda e: sum(v[...].nbytes for _, v in nnx.to_flat_state(e._params))  # noqa: E731
    packed = [v for _, v in nnx.to_flat_state(on._params) if ops.packed_shape(v) is not None]
    assert packed and all(v[...].ndim == 1 for v in packed)
    # A packed weight adds less than one panel row of zeros to its own elements.
    extra = sum(cpu_decode.panel_width() * v[...].dtype.itemsize for v in packed)
    assert bytes_of(off) <= bytes_of(on) < bytes_of(off) + extra


def _state(engine):
    """A DecodeState for one 3-token prompt, built the way the engine builds it."""
    from hljax.generate import steps as eng

    B, M, S = 1, 16, 32
    st = eng.empty_state(engine.model_config, B, S, M, engine.config.max_stop_ids)
    return st.replace(done=jnp.zeros((B,), bool), width=jnp.full((B,), 3, jnp.int32),
                      params=st.params.replace(prompt_len=jnp.full((B,), 3, jnp.int32),
                                               max_new=jnp.full((B,), 4, jnp.int32)))


@needs_kernels
def test_weight_swap_repacks(tiny_untied, tmp_path):
    on, off = _engines(tiny_untied)
    other = tiny.save_hf_qwen3(tmp_path / "other", tie=False, rope="yarn", seed=7)
    mesh = shd.single_device_mesh()
    for engine in (on, off):
        engine.set_model(hf.load_hf(other, mesh), weight_version="2")
    sp = SamplingParams(max_new_tokens=12, temperature=0.0, stop_token_ids=())
    prompts = _prompts()
    a = [o.token_ids for o in on.generate([Request(p, sp) for p in prompts])]
    assert a == [o.token_ids for o in off.generate([Request(p, sp) for p in prompts])]


def test_a_missing_compiler_is_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("HLJAX_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    with pytest.raises(cpu_decode.KernelUnavailable, match="no C.. compiler '/nonexistent/g..' found"):
        cpu_decode._build("avx2")


def test_a_forced_isa_the_cpu_lacks_is_refused(monkeypatch):
    monkeypatch.setattr(cpu_decode, "_cpu_flags", lambda: {"avx2", "fma"})
    monkeypatch.setenv("HLJAX_CPU_ISA", "avx512")
    with pytest.raises(cpu_decode.KernelUnavailable, match="lacks it"):
        cpu_decode.isa()
    monkeypatch.setenv("HLJAX_CPU_ISA", "avx2")
    assert cpu_decode.isa() == "avx2"
    monkeypatch.setattr(cpu_decode, "_cpu_flags", lambda: {"avx512f", "avx2", "fma"})
    monkeypatch.delenv("HLJAX_CPU_ISA")
    assert cpu_decode.isa() == "avx512"
    monkeypatch.setattr(cpu_decode, "_cpu_flags", lambda: {"sse4_2"})
    with pytest.raises(cpu_decode.KernelUnavailable, match="neither AVX-512F nor AVX2"):
        cpu_decode.isa()


def test_config_errors_name_the_problem():
    with pytest.raises(ValueError, match="cpu_kernels"):
        EngineConfig(cpu_kernels="yes")


def test_on_with_a_sharded_mesh_says_why(tiny_untied):
    mesh = shd.make_mesh(MeshConfig(1, 2, 1), jax.devices()[:2])
    with pytest.raises(cpu_decode.KernelUnavailable, match="2 devices"):
        Engine(hf.load_hf(tiny_untied, mesh), mesh, EngineConfig(cpu_kernels="on"))


def test_auto_on_a_sharded_mesh_uses_xla(tiny_untied):
    mesh = shd.make_mesh(MeshConfig(1, 2, 1), jax.devices()[:2])
    engine = Engine(hf.load_hf(tiny_untied, mesh), mesh, EngineConfig(cpu_kernels="auto"))
    assert engine.kernels is False
    assert not any(ops.packed_shape(v) for _, v in nnx.to_flat_state(engine._params))


def test_dense_without_packing_is_the_plain_matmul():
    w = nnx.Param(jnp.arange(2 * 3 * 4, dtype=jnp.float32).reshape(2, 3, 4), dense_in=2)
    x = jnp.ones((5, 1, 6), jnp.float32)
    y = ops.dense(x, w)
    assert y.shape == (5, 1, 4)
    np.testing.assert_allclose(np.asarray(y), np.ones((5, 1, 6)) @ np.arange(24.0).reshape(6, 4))


def test_the_build_cache_key_changes_with_whatever_changes_the_build():
    """An upgrade of jaxlib or the compiler, or other flags, must not load a library built before it."""
    base = dict(source=b"int f();", flags=["-O3", "-mavx2"], compiler="/usr/bin/g++ g++ 12.2.0",
                jaxlib_version="0.10.2", include_dir="/venv/jaxlib/include")
    key = cpu_decode.build_key(**base)
    assert cpu_decode.build_key(**base) == key
    for field, other in [("source", b"int g();"), ("flags", ["-O2", "-mavx2"]), ("compiler", "/usr/bin/g++ g++ 13.1.0"),
                         ("jaxlib_version", "0.10.3"), ("include_dir", "/other/include")]:
        assert cpu_decode.build_key(**{**base, field: other}) != key, field
    # Joined with separators: moving a character from one part to the next is another key.
    assert cpu_decode.build_key(**{**base, "flags": ["-O3 -mavx2"]}) != key
