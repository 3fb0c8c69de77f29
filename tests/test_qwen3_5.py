"""Our NNX Qwen3.5 against transformers' Qwen3.5 text model, and the two Gated DeltaNet forms."""

import json
import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from transformers.models.qwen3_5 import modeling_qwen3_5 as hf_q35

from hljax import sharding as shd
from hljax.checkpoint import hf
from hljax.models import gated_deltanet as gdn
from hljax.models import qwen3_5
from hljax.models.config import ConfigError
from tests import tiny
from tests import tiny_qwen3_5 as tq

LENGTHS = [37, 5, 20, 1]  # Left-padded; 37 spans several chunks of the chunk sizes below.

CASES = {
    "vlm-layout": dict(vision=True),  # The released layout: nested config, model.language_model., vision tower.
    "text-layout-tied": dict(vision=False, tie_word_embeddings=True),
    "full-first-mha": dict(vision=False, layer_types=["full_attention", "linear_attention"], num_hidden_layers=2,
                           linear_num_value_heads=2, num_key_value_heads=4, linear_conv_kernel_dim=3),
}


@pytest.fixture(scope="module")
def tiny_vlm(tmp_path_factory):
    return tq.save(tmp_path_factory.mktemp("q35vlm"), vision=True)


def _ours(path, tokens, mask, positions, **load_kw):
    mesh = shd.single_device_mesh()
    model = hf.load_hf(path, mesh, **load_kw)
    with shd.use_mesh(mesh):
        forward = nnx.jit(lambda m, *a: m(*a))
        return np.asarray(forward(model, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(mask)), np.float32)


@pytest.mark.parametrize("case", list(CASES))
def test_fp32_logits_match_transformers_with_left_padding(case, tmp_path):
    path = tq.save(tmp_path, **CASES[case])
    ref = tq.causal_lm(path)
    # Past ops.CAUSAL_BLOCK (128) rows, full attention runs in causal blocks: a long row too.
    tokens, mask, positions = tiny.left_padded_batch(160, LENGTHS + [300])
    want = tiny.hf_logits(ref, tokens, mask, positions)
    got = _ours(path, tokens, mask, positions)
    real = mask.astype(bool)
    assert np.abs(want[real]).max() > 1.0, "logits too small for the comparison to mean anything"
    np.testing.assert_allclose(got[real], want[real], atol=1e-4, rtol=0)


def test_left_padded_rows_equal_each_row_alone_in_transformers(tiny_vlm):
    """transformers zeroes padding before its linear-attention layers, so a padded row equals the row
    alone there; ours must equal that unpadded reference row by row."""
    ref = tq.causal_lm(tiny_vlm)
    tokens, mask, positions = tiny.left_padded_batch(160, LENGTHS)
    got = _ours(tiny_vlm, tokens, mask, positions)
    for b, n in enumerate(LENGTHS):
        alone = tiny.hf_logits(ref, tokens[b : b + 1, -n:], mask[b : b + 1, -n:], positions[b : b + 1, -n:])
        np.testing.assert_allclose(got[b, -n:], alone[0], atol=1e-4, rtol=0)


def _gdn_inputs(T=37, B=2, Hk=2, Hv=4, Dk=8, Dv=6, seed=0):
    rng = np.random.default_rng(seed)
    q, k = (rng.standard_normal((B, T, Hk, Dk)).astype(np.float32) for _ in range(2))
    v = rng.standard_normal((B, T, Hv, Dv)).astype(np.float32)
    g = -rng.uniform(0.01, 2.0, (B, T, Hv)).astype(np.float32)  # log decay
    beta = rng.uniform(0, 1, (B, T, Hv)).astype(np.float32)
    state = rng.standard_normal((B, Hv, Dk, Dv)).astype(np.float32)
    return q, k, v, g, beta, state


@pytest.mark.parametrize("chunk", [1, 4, 7, 16, 64])
def test_chunked_equals_recurrent_token_by_token(chunk):
    """Chunk sizes that divide 37 and ones that do not, from a nonzero initial state."""
    q, k, v, g, beta, state = _gdn_inputs()
    qp, kp = gdn.prepare_qk(jnp.asarray(q), jnp.asarray(k), v.shape[2])
    o_rec, s_rec = gdn.recurrent(qp, kp, v, g, beta, state)
    o_chk, s_chk = gdn.chunked(qp, kp, v, g, beta, state, chunk)
    np.testing.assert_allclose(np.asarray(o_chk), np.asarray(o_rec), atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(s_chk), np.asarray(s_rec), atol=1e-5, rtol=0)


def test_both_forms_equal_transformers_recurrent_reference():
    q, k, v, g, beta, state = _gdn_inputs(T=21, seed=1)
    t = lambda x: torch.from_numpy(x)  # noqa: E731
    want, want_state = hf_q35.torch_recurrent_gated_delta_rule(
        t(q), t(k), t(v), g=t(g), beta=t(beta), initial_state=t(state), output_final_state=True,
        use_qk_l2norm_in_kernel=True)
    qp, kp = gdn.prepare_qk(jnp.asarray(q), jnp.asarray(k), v.shape[2])
    for o, s in (gdn.recurrent(qp, kp, v, g, beta, state), gdn.chunked(qp, kp, v, g, beta, state, 8)):
        np.testing.assert_allclose(np.asarray(o), want.numpy(), atol=1e-5, rtol=0)
        np.testing.assert_allclose(np.asarray(s), want_state.numpy(), atol=1e-5, rtol=0)


def test_causal_conv_continues_from_its_state():
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((2, 9, 5)).astype(np.float32), rng.standard_normal((4, 5)).astype(np.float32)
    zero = jnp.zeros((2, 3, 5))
    full, _ = gdn.causal_conv(x, w, zero)
    want = torch.nn.functional.silu(hf_q35.causal_conv1d_fn(torch.from_numpy(x).transpose(1, 2),
                                                            torch.from_numpy(w.T.copy()))).transpose(1, 2)
    np.testing.assert_allclose(np.asarray(full), want.numpy(), atol=1e-6)
    head, state = gdn.causal_conv(x[:, :4], w, zero)
    outs, st = [head], state
    for i in range(4, 9):
        y, st = gdn.causal_conv(x[:, i : i + 1], w, st)
        outs.append(y)
    np.testing.assert_allclose(np.asarray(jnp.concatenate(outs, axis=1)), np.asarray(full), atol=1e-6)


def test_prefill_then_token_by_token_decode_equals_one_forward(tiny_vlm):
    """Decode (recurrent form, fixed-size state) after a chunked prefill gives the forward's hidden states."""
    mesh = shd.single_device_mesh()
    model = hf.load_hf(tiny_vlm, mesh, linear_chunk_size=8)
    tokens, mask, positions = tiny.left_padded_batch(160, [30, 12])
    T, P = tokens.shape[1], 24  # prefill 24 slots (row 1: 6 real tokens), then 6 single-token steps
    with shd.use_mesh(mesh):
        forward = nnx.jit(lambda m, *a: m.hidden_states(*a))
        want = np.asarray(forward(model, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(mask)))
        cache = qwen3_5.init_cache(model.cfg, 2, T)
        kv_valid = jnp.asarray(mask.astype(bool))
        prefill = nnx.jit(lambda m, *a: m.decode_step(*a, prefill=True))
        h, cache = prefill(model, jnp.asarray(tokens[:, :P]), jnp.asarray(positions[:, :P]), kv_valid, cache, 0)
        outs = [np.asarray(h)]
        step = nnx.jit(lambda m, *a: m.decode_step(*a))
        for i in range(P, T):
            h, cache = step(model, jnp.asarray(tokens[:, i : i + 1]), jnp.asarray(positions[:, i : i + 1]), kv_valid, cache,
                            jnp.int32(i))
            outs.append(np.asarray(h))
    got = np.concatenate(outs, axis=1)
    real = mask.astype(bool)
    # 4 layers of fp32 rounding (the two GDN forms agree to 1e-5 each, above): the parity bound.
    np.testing.assert_allclose(got[real], want[real], atol=1e-4, rtol=0)


def test_chunk_size_does_not_change_logits(tiny_vlm):
    tokens, mask, positions = tiny.left_padded_batch(160, LENGTHS)
    a = _ours(tiny_vlm, tokens, mask, positions, linear_chunk_size=5)
    b = _ours(tiny_vlm, tokens, mask, positions, linear_chunk_size=64)
    real = mask.astype(bool)
    # Logits of size ~2.5 after 4 layers: fp32 rounding of different summation orders, 1.2e-5 measured.
    np.testing.assert_allclose(a[real], b[real], atol=5e-5, rtol=0)


def _edit_config(src, dst, edit):
    shutil.copytree(src, dst)
    file = os.path.join(dst, "config.json")
    cfg = json.load(open(file))
    edit(cfg)
    json.dump(cfg, open(file, "w"))
    return str(dst)


def test_unsupported_config_values_are_named(tiny_vlm, tmp_path):
    cases = [
        (lambda c: c["text_config"].__setitem__("layer_types", ["linear_attention", "sliding_attention"] * 2),
         r"text_config\.layer_types=\['sliding_attention'\] is not supported"),
        (lambda c: c["text_config"].__setitem__("hidden_act", "gelu"), r"text_config\.hidden_act='gelu'"),
        (lambda c: c["text_config"].__setitem__("tie_word_embeddings", True),
         r"text_config\.tie_word_embeddings=True is not supported: it disagrees with the top-level"),
        (lambda c: c.pop("text_config"), r"model_type='qwen3_5' needs a 'text_config' object"),
        (lambda c: c["text_config"].__setitem__("linear_num_value_heads", 3),
         r"linear_num_value_heads=3 is not a multiple of linear_num_key_heads=2"),
    ]
    for n, (edit, pattern) in enumerate(cases):
        path = _edit_config(tiny_vlm, tmp_path / str(n), edit)
        with pytest.raises(ConfigError, match=r"config\.json: .*" + pattern):
            hf.load_hf(path)


@pytest.mark.parametrize("L", [1, 3, 7, 16, 64])
def test_unit_lower_inverse_equals_numpy(L):
    """The chunked form's matmul-only triangular inverse (no LAPACK call: see gated_deltanet.chunked)."""
    rng = np.random.default_rng(L)
    A = np.tril(rng.uniform(-0.5, 0.5, (2, 3, L, L)), -1).astype(np.float32)
    want = np.linalg.inv(np.eye(L) + A.astype(np.float64))
    got = np.asarray(gdn.unit_lower_inverse(jnp.asarray(A)))
    np.testing.assert_allclose(got, want, atol=1e-5 * max(1.0, np.abs(want).max()), rtol=0)
