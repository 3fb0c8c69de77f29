"""Qwen3.5 HF checkpoints: both layouts load, export round-trips, the vision tower is skipped and kept."""

import json
import logging
import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from safetensors.torch import load_file

from hljax import sharding as shd
from hljax.checkpoint import hf
from hljax.models import registry
from hljax.models.config import ModelConfig
from tests import tiny
from tests import tiny_qwen3_5 as tq
from tests.test_hf_checkpoint import _state_dict


@pytest.fixture(scope="module")
def tiny_vlm(tmp_path_factory):
    return tq.save(tmp_path_factory.mktemp("q35vlm"), vision=True)


def _all_tensors(path):
    out = {}
    for name in os.listdir(path):
        if name.endswith(".safetensors"):
            out.update(load_file(os.path.join(path, name)))
    return out


def test_vlm_checkpoint_round_trips_bit_exactly_with_its_vision_tower(tiny_vlm, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="hljax.checkpoint.hf"):
        model = hf.load_hf(tiny_vlm, shd.single_device_mesh())
    assert any("skipping 21 tensors outside the text model (model.visual)" in r.message for r in caplog.records)
    assert model.cfg.model_type == "qwen3_5" and model.cfg.hf_prefix == "model.language_model."
    out = hf.save_hf(model, str(tmp_path / "export"), max_shard_bytes=60_000)  # Several shards.
    assert len(set(json.load(open(os.path.join(out, hf.INDEX_FILE)))["weight_map"].values())) > 1
    assert _state_dict(out) == _state_dict(tiny_vlm)
    want, got = _all_tensors(tiny_vlm), _all_tensors(out)
    for key in want:
        assert torch.equal(got[key], want[key]), key
    cfg_out, cfg_src = (json.load(open(os.path.join(p, "config.json"))) for p in (out, tiny_vlm))
    assert cfg_out["text_config"] == cfg_src["text_config"] and cfg_out["vision_config"] == cfg_src["vision_config"]
    # transformers loads the export as the full multimodal model, vision tower included.
    back = transformers.Qwen3_5ForConditionalGeneration.from_pretrained(out).eval()
    src = transformers.Qwen3_5ForConditionalGeneration.from_pretrained(tiny_vlm).eval()
    for (name, p), (_, q) in zip(back.named_parameters(), src.named_parameters()):
        assert torch.equal(p, q), name


def test_export_without_the_source_vision_weights_is_an_error(tiny_vlm, tmp_path):
    src = shutil.copytree(tiny_vlm, tmp_path / "src")
    model = hf.load_hf(str(src), shd.single_device_mesh())
    shutil.rmtree(src)
    with pytest.raises(hf.CheckpointError, match=r"declares a vision_config but no vision tower weights"):
        hf.save_hf(model, str(tmp_path / "out"))
    out = hf.save_hf(model, str(tmp_path / "out"), source_dir=tiny_vlm)  # Pointing at it works.
    assert any(k.startswith("model.visual.") for k in _all_tensors(out))


def test_text_only_checkpoint_round_trips_with_model_prefix(tmp_path):
    src = tq.save(tmp_path / "src", vision=False, tie_word_embeddings=True)
    model = hf.load_hf(src, shd.single_device_mesh())
    assert model.cfg.model_type == "qwen3_5_text" and model.cfg.hf_prefix == "model."
    out = hf.save_hf(model, str(tmp_path / "out"))
    assert _state_dict(out) == _state_dict(src)
    want, got = _all_tensors(src), _all_tensors(out)
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_fresh_model_exports_a_checkpoint_transformers_agrees_with(tmp_path):
    """A randomly initialised model (no source folder) exports a text-only Qwen3_5ForCausalLM whose
    transformers logits equal ours."""
    cfg = ModelConfig.qwen3_5_4b(vocab_size=128, hidden_size=64, intermediate_size=96, num_layers=4, num_heads=4,
                                 num_kv_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
                                 linear_key_head_dim=16, linear_value_head_dim=16, max_position_embeddings=256,
                                 eos_token_ids=(2,))
    mesh = shd.single_device_mesh()
    model = registry.create(cfg, mesh, seed=3)
    with shd.use_mesh(mesh):  # Non-trivial norms, so a wrong (1 + w) convention would show.
        for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
            if path[-1] == "scale":
                var.set_value(var.get_value() + 0.1 * jnp.sin(jnp.arange(var.shape[0], dtype=jnp.float32)))
    out = hf.save_hf(model, str(tmp_path / "fresh"), dtype="float32")
    assert json.load(open(os.path.join(out, "config.json")))["architectures"] == ["Qwen3_5ForCausalLM"]
    ref = tq.causal_lm(out)
    tokens, mask, positions = tiny.left_padded_batch(128, [11, 4])
    want = tiny.hf_logits(ref, tokens, mask, positions)
    with shd.use_mesh(mesh):
        got = np.asarray(nnx.jit(lambda m, *a: m(*a))(model, jnp.asarray(tokens), jnp.asarray(positions),
                                                      jnp.asarray(mask)))
    real = mask.astype(bool)
    np.testing.assert_allclose(got[real], want[real], atol=1e-4, rtol=0)


def test_bf16_vlm_checkpoint_round_trips_bit_exactly(tmp_path):
    src = tq.save(tmp_path / "src", vision=True, dtype=torch.bfloat16)
    model = hf.load_hf(src, shd.single_device_mesh(), dtype=jnp.bfloat16)
    out = hf.save_hf(model, str(tmp_path / "out"))
    want, got = _all_tensors(src), _all_tensors(out)
    assert set(got) == set(want)
    for key in want:
        assert got[key].dtype == torch.bfloat16 and torch.equal(got[key], want[key]), key
