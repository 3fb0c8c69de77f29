"""Tiny random Qwen3.5 checkpoints made locally with transformers (no downloads).

`save(path, vision=True)` writes what the released checkpoints look like: a Qwen3_5ForConditionalGeneration
(nested `text_config`, text keys under `model.language_model.`, a tiny vision tower under `model.visual.`);
`vision=False` writes a text-only Qwen3_5ForCausalLM (flat config, keys under `model.`).
"""

from __future__ import annotations

import torch
import transformers

from tests import tiny

TEXT = dict(
    vocab_size=160,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=4,
    # Full attention in the middle, so linear layers both feed it and read its output.
    layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"],
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=16,
    linear_value_head_dim=24,
    linear_num_key_heads=2,
    linear_num_value_heads=4,  # 2 value heads per key head: exercises the head repeat.
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    initializer_range=0.08,  # Larger than HF's 0.02 so logits are O(1) and errors show.
    eos_token_id=2,
    bos_token_id=1,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                     "mrope_section": [1, 1, 2], "mrope_interleaved": True},
)
VISION = dict(depth=1, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64, patch_size=4,
              temporal_patch_size=2, num_position_embeddings=16)


def text_config(**kw) -> transformers.Qwen3_5TextConfig:
    return transformers.Qwen3_5TextConfig(**{**TEXT, **kw})


def _randomise(model: torch.nn.Module, seed: int) -> None:
    """Random norms, decay rates and time-step biases, so a missed or transposed one shows in the logits."""
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("linear_attn.norm.weight"):  # plain w * x_hat
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif "norm" in name and "visual" not in name:  # zero-centred: x_hat * (1 + w)
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn(p.shape, generator=g))
            elif name.endswith("A_log"):  # A in [0.5, 4]: decays from fast to slow within a few tokens.
                p.copy_(torch.empty(p.shape).uniform_(0.5, 4.0, generator=g).log())


def hf_model(vision: bool = False, seed: int = 0, **kw):
    torch.manual_seed(seed)
    if vision:
        cfg = transformers.Qwen3_5Config(text_config={**TEXT, **kw}, vision_config=VISION,
                                         tie_word_embeddings=kw.get("tie_word_embeddings", False))
        model = transformers.Qwen3_5ForConditionalGeneration(cfg)
    else:
        model = transformers.Qwen3_5ForCausalLM(text_config(**kw))
    _randomise(model, seed)
    return model.eval()


def save(path, vision: bool = False, seed: int = 0, dtype=torch.float32, **kw) -> str:
    model = hf_model(vision, seed, **kw)
    model.to(dtype).save_pretrained(str(path))
    tiny.tokenizer(TEXT["vocab_size"]).save_pretrained(str(path))
    return str(path)


def causal_lm(path) -> torch.nn.Module:
    """transformers' text-only reference for a checkpoint of either layout."""
    return transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
