"""HF safetensors load/export: round trip through transformers, and loud errors on bad input."""

import json
import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from safetensors import safe_open
from safetensors.torch import load_file

from hljax import sharding as shd
from hljax.checkpoint import hf
from hljax.models.config import ConfigError
from tests import tiny


def _state_dict(path):
    """key -> (shape, dtype) over every safetensors file of an HF folder, via the safetensors package."""
    out = {}
    for name in os.listdir(path):
        if name.endswith(".safetensors"):
            with safe_open(os.path.join(path, name), framework="pt") as f:
                for key in f.keys():
                    t = f.get_tensor(key)
                    out[key] = (tuple(t.shape), t.dtype)
    return out


@pytest.mark.parametrize("fixture", ["tiny_untied", "tiny_tied"])
def test_export_round_trip_through_transformers(fixture, request, tmp_path):
    src = request.getfixturevalue(fixture)
    model = hf.load_hf(src, shd.single_device_mesh())
    out = hf.save_hf(model, str(tmp_path / "export"), max_shard_bytes=40_000)  # Forces several shards.

    index = json.load(open(os.path.join(out, hf.INDEX_FILE)))
    shards = set(index["weight_map"].values())
    assert len(shards) > 1 and all(os.path.exists(os.path.join(out, s)) for s in shards)
    assert _state_dict(out) == _state_dict(src)  # Same keys, shapes and dtypes.

    ref = transformers.AutoModelForCausalLM.from_pretrained(src, attn_implementation="eager").eval()
    back = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    tokens, mask, positions = tiny.left_padded_batch(ref.config.vocab_size, [9, 4, 13])
    np.testing.assert_allclose(
        tiny.hf_logits(back, tokens, mask, positions), tiny.hf_logits(ref, tokens, mask, positions), atol=1e-5
    )
    # Tokenizer and generation config travel with the weights.
    tok_src = transformers.AutoTokenizer.from_pretrained(src)
    tok_out = transformers.AutoTokenizer.from_pretrained(out)
    assert tok_out("def solve(q):").input_ids == tok_src("def solve(q):").input_ids
    assert os.path.exists(os.path.join(out, "generation_config.json"))


def test_export_single_file_and_overwrite_leaves_no_stale_shards(tiny_untied, tmp_path):
    model = hf.load_hf(tiny_untied, shd.single_device_mesh())
    out = str(tmp_path / "export")
    hf.save_hf(model, out, max_shard_bytes=40_000)
    hf.save_hf(model, out, replace=True)  # Same folder, now one file: old shards and index must be gone.
    names = sorted(os.listdir(out))
    assert hf.SINGLE_FILE in names and hf.INDEX_FILE not in names
    assert not [n for n in names if n.startswith("model-")]
    want = load_file(os.path.join(tiny_untied, hf.SINGLE_FILE))
    got = load_file(os.path.join(out, hf.SINGLE_FILE))
    assert set(got) == set(want)
    for key in want:
        assert torch.equal(got[key], want[key]), key


def test_bf16_checkpoint_round_trips_bit_exactly(tmp_path):
    src = tiny.save_hf_qwen3(tmp_path / "src", tie=False, rope="yarn", dtype=torch.bfloat16)
    model = hf.load_hf(src, shd.single_device_mesh(), dtype=jnp.bfloat16)
    assert model.layers[0].attn.q_proj[...].dtype == jnp.bfloat16
    out = hf.save_hf(model, str(tmp_path / "out"))
    assert json.load(open(os.path.join(out, "config.json")))["dtype"] == "bfloat16"
    want, got = load_file(os.path.join(src, hf.SINGLE_FILE)), load_file(os.path.join(out, hf.SINGLE_FILE))
    assert set(got) == set(want)
    for key in want:
        assert got[key].dtype == torch.bfloat16 and torch.equal(got[key], want[key]), key


def test_fp32_model_from_bf16_checkpoint_exports_bf16_by_default(tmp_path):
    src = tiny.save_hf_qwen3(tmp_path / "src", tie=True, dtype=torch.bfloat16)
    model = hf.load_hf(src, shd.single_device_mesh(), dtype=jnp.float32)
    assert model.embed[...].dtype == jnp.float32
    out = hf.save_hf(model, str(tmp_path / "out"))
    assert {d for _, d in _state_dict(out).values()} == {torch.bfloat16}
    out32 = hf.save_hf(model, str(tmp_path / "out32"), dtype="float32")
    assert {d for _, d in _state_dict(out32).values()} == {torch.float32}


# ---- bad input: each error names the file and the key ----


def _copy(src, dst):
    shutil.copytree(src, dst)
    return str(dst)


def test_unknown_model_type_names_file_and_key(tiny_untied, tmp_path):
    path = _copy(tiny_untied, tmp_path / "m")
    cfg_file = os.path.join(path, "config.json")
    cfg = json.load(open(cfg_file))
    cfg["model_type"] = "llama"
    json.dump(cfg, open(cfg_file, "w"))
    with pytest.raises(ConfigError, match=r"config\.json: model_type='llama' is not supported"):
        hf.load_hf(path)


def test_missing_shard_names_index_and_shard(tiny_untied, tmp_path):
    model = hf.load_hf(tiny_untied)
    out = hf.save_hf(model, str(tmp_path / "sharded"), max_shard_bytes=40_000)
    index = json.load(open(os.path.join(out, hf.INDEX_FILE)))
    victim = sorted(set(index["weight_map"].values()))[-1]
    os.remove(os.path.join(out, victim))
    with pytest.raises(hf.CheckpointError, match=rf"{hf.INDEX_FILE}: shard '{victim}' \(holding key '.+'\) does not"):
        hf.load_hf(out)


def test_shape_mismatch_names_file_and_key(tiny_untied, tmp_path):
    path = _copy(tiny_untied, tmp_path / "m")
    cfg_file = os.path.join(path, "config.json")
    cfg = json.load(open(cfg_file))
    cfg["intermediate_size"] = 128  # The weights were saved with 96.
    json.dump(cfg, open(cfg_file, "w"))
    with pytest.raises(
        hf.CheckpointError,
        match=r"model\.safetensors: key 'model\.layers\.0\.mlp\.\w+_proj\.weight' has shape \((96, 64|64, 96)\), "
        r"but config\.json implies \((128, 64|64, 128)\)",
    ):
        hf.load_hf(path)


def test_missing_and_unused_tensors_are_errors(tiny_untied, tmp_path):
    tensors = load_file(os.path.join(tiny_untied, hf.SINGLE_FILE))
    from safetensors.torch import save_file

    missing = _copy(tiny_untied, tmp_path / "missing")
    save_file({k: v for k, v in tensors.items() if k != "lm_head.weight"}, os.path.join(missing, hf.SINGLE_FILE),
              metadata={"format": "pt"})
    with pytest.raises(hf.CheckpointError, match=r"no tensor 'lm_head\.weight'"):
        hf.load_hf(missing)

    extra = _copy(tiny_untied, tmp_path / "extra")
    save_file({**tensors, "model.extra.weight": torch.zeros(3)}, os.path.join(extra, hf.SINGLE_FILE),
              metadata={"format": "pt"})
    with pytest.raises(hf.CheckpointError, match=r"not used by the model, e\.g\. \['model\.extra\.weight'\]"):
        hf.load_hf(extra)


def test_unsupported_config_values_are_named(tiny_untied, tmp_path):
    for key, value, pattern in [
        ("hidden_act", "gelu", r"hidden_act='gelu'"),
        ("use_sliding_window", True, r"use_sliding_window=True"),
        ("rope_parameters", {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}, r"rope_type='dynamic'"),
    ]:
        path = _copy(tiny_untied, tmp_path / key)
        cfg_file = os.path.join(path, "config.json")
        cfg = json.load(open(cfg_file))
        cfg[key] = value
        json.dump(cfg, open(cfg_file, "w"))
        with pytest.raises(ConfigError, match=r"config\.json: .*" + pattern):
            hf.load_hf(path)


def test_a_real_shape_preset_carries_a_tokenizer_with_its_special_ids(tmp_path, monkeypatch):
    """Random weights of a real shape (here Qwen3-0.6B's layout at a small width) run end to end: the
    folder holds the bundled tokenizer with its chat template, and the config's eos / pad ids are that
    tokenizer's, inside the vocabulary (the 0.6B preset wrote no tokenizer, and GRPO stopped at its first
    prompt: "tokenizer.chat_template is not set")."""
    from hljax.checkpoint import presets
    from hljax.models.config import ModelConfig

    small = dict(vocab_size=8192, hidden_size=64, intermediate_size=128, num_layers=1, num_heads=2, num_kv_heads=1,
                 head_dim=32)
    monkeypatch.setitem(presets.PRESETS, "qwen3-small-shape", lambda **kw: ModelConfig.qwen3_0p6b(**small, **kw))
    out = presets.init_model("qwen3-small-shape", str(tmp_path / "m"))
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert tok.chat_template and len(tok) <= small["vocab_size"]
    config = json.load(open(os.path.join(out, "config.json")))
    assert config["eos_token_id"] == [tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")]
    assert config["bos_token_id"] is None
    ref = transformers.AutoModelForCausalLM.from_pretrained(out)  # Loads as transformers' Qwen3.
    assert ref.config.vocab_size == small["vocab_size"] and ref.config.num_hidden_layers == 1
