"""Our NNX Qwen3 against transformers' Qwen3ForCausalLM on the same random weights."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from hljax import sharding as shd
from hljax.checkpoint import hf
from tests import tiny

LENGTHS = [37, 5, 20, 1]  # Left-padded; 37 > yarn's original_max_position_embeddings of 32.

CASES = {
    "untied-yarn": dict(tie=False, rope="yarn"),
    "tied-default": dict(tie=True, rope="default"),
    "untied-linear": dict(tie=False, rope="linear"),
    "tied-llama3-bias": dict(tie=True, rope="llama3", attention_bias=True),
    "mha-3layers": dict(tie=False, rope="default", num_key_value_heads=4, num_hidden_layers=3),
}


def _ours(path, tokens, mask, positions, **load_kw):
    mesh = shd.single_device_mesh()
    model = hf.load_hf(path, mesh, **load_kw)
    with shd.use_mesh(mesh):
        return np.asarray(model(jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(mask)), np.float32)


@pytest.mark.parametrize("case", list(CASES))
def test_fp32_logits_match_transformers(case, tmp_path):
    path = tiny.save_hf_qwen3(tmp_path, **CASES[case])
    ref = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    tokens, mask, positions = tiny.left_padded_batch(ref.config.vocab_size, LENGTHS)
    want = tiny.hf_logits(ref, tokens, mask, positions)
    got = _ours(path, tokens, mask, positions)
    real = mask.astype(bool)
    assert np.abs(want[real]).max() > 1.0, "logits too small for the comparison to mean anything"
    np.testing.assert_allclose(got[real], want[real], atol=1e-4, rtol=0)


def test_long_rows_through_causal_attention_blocks_match_transformers(tiny_untied):
    """Past ops.CAUSAL_BLOCK query rows, attention runs in blocks that skip the keys past their end:
    lengths across a block edge, a partial last block, left padding."""
    from hljax.models import ops

    lengths = [3 * ops.CAUSAL_BLOCK - 40, 45, 2 * ops.CAUSAL_BLOCK + 1, ops.CAUSAL_BLOCK]
    ref = transformers.AutoModelForCausalLM.from_pretrained(tiny_untied, attn_implementation="eager").eval()
    tokens, mask, positions = tiny.left_padded_batch(ref.config.vocab_size, lengths)
    want = tiny.hf_logits(ref, tokens, mask, positions)
    got = _ours(tiny_untied, tokens, mask, positions)
    real = mask.astype(bool)
    np.testing.assert_allclose(got[real], want[real], atol=1e-4, rtol=0)


def test_left_padding_does_not_change_a_row(tiny_untied):
    """A row's logits are the same alone and inside a left-padded batch."""
    tokens, mask, positions = tiny.left_padded_batch(160, LENGTHS)
    batch = _ours(tiny_untied, tokens, mask, positions)
    b = 1
    alone = _ours(tiny_untied, tokens[b : b + 1, -LENGTHS[b] :], mask[b : b + 1, -LENGTHS[b] :],
                  positions[b : b + 1, -LENGTHS[b] :])
    np.testing.assert_allclose(batch[b, -LENGTHS[b] :], alone[0], atol=1e-5)


def test_bf16_logits_close_to_fp32_reference(tmp_path):
    path = tiny.save_hf_qwen3(tmp_path, tie=False, rope="yarn", dtype=torch.bfloat16)
    ref = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokens, mask, positions = tiny.left_padded_batch(ref.config.vocab_size, LENGTHS)
    want = tiny.hf_logits(ref, tokens, mask, positions)
    got = _ours(path, tokens, mask, positions, dtype=jnp.bfloat16)
    real = mask.astype(bool)
    err = np.abs(got[real] - want[real])
    # bf16 keeps ~3 significant digits; an indexing or layout bug would be O(logit scale).
    assert err.max() < 0.1 * np.abs(want[real]).max(), err.max()
    assert np.mean(err) < 0.01 * np.abs(want[real]).max()
