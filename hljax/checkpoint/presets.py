"""Randomly initialised models of named shapes, written as HF folders (weights, config, tokenizer)."""

from __future__ import annotations

import os

import transformers

from hljax import sharding as shd
from hljax.checkpoint import hf, owner
from hljax.models import registry
from hljax.models.config import ModelConfig

TOKENIZER_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets", "tokenizer")
PRESETS = {"tiny": ModelConfig.tiny, "tiny-deep": ModelConfig.tiny_deep, "tiny-hd128": ModelConfig.tiny_hd128, "tiny-qwen3.5": ModelConfig.tiny_qwen3_5, "qwen3-0.6b": ModelConfig.qwen3_0p6b,
           "qwen3-4b": ModelConfig.qwen3_4b, "qwen3.5-4b": ModelConfig.qwen3_5_4b}


def init_model(preset: str, out: str, seed: int = 0, *, writer: str = "launch.init_model",
               replace: bool = False) -> str:
    """Write preset `preset` with random weights to the HF folder `out`; returns `out`. An existing `out`
    is replaced only with `replace`, and only if `writer` wrote it (hf.save_hf)."""
    owner.check_replaceable(out, writer, replace, flag="replace=True")  # Before the model is built.
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {sorted(PRESETS)}")
    tokenizer = transformers.AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    ids = tokenizer.convert_tokens_to_ids
    special = dict(eos_token_ids=(ids("<|im_end|>"), ids("<|endoftext|>")), pad_token_id=ids("<|endoftext|>"))
    if preset.startswith("tiny"):
        vocab = -(-len(tokenizer) // 64) * 64  # Round up: friendlier matmul shapes.
        cfg = PRESETS[preset](vocab, **special)
    else:
        # A real shape with random weights (benchmarks, memory and speed at scale, without a hub) carries
        # the bundled tokenizer too, whose ids are a subset of its vocabulary, so that it runs end to
        # end (GRPO needs a chat template); a real checkpoint's folder brings its own tokenizer.
        cfg = PRESETS[preset](bos_token_id=None, **special)
    model = registry.create(cfg, shd.make_mesh(), seed=seed)
    return hf.save_hf(model, out, dtype="float32", source_dir=TOKENIZER_DIR, writer=writer, replace=replace)
