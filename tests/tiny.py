"""Tiny random Qwen3 checkpoints made locally with transformers (no downloads)."""

from __future__ import annotations

import numpy as np
import torch
import transformers

from hljax.tokenizer import CHAT_TEMPLATE

ROPE = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "rope_theta": 1e6},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
        "rope_theta": 500000.0,
    },
}


def qwen3_config(tie: bool = False, rope: str = "default", **kw) -> transformers.Qwen3Config:
    args = dict(
        vocab_size=160,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=24,  # != hidden_size / heads on purpose
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        tie_word_embeddings=tie,
        rope_parameters=dict(ROPE[rope]),
        initializer_range=0.08,  # Larger than HF's 0.02 so logits are O(1) and errors show.
        eos_token_id=2,
        bos_token_id=1,
    )
    args.update(kw)
    return transformers.Qwen3Config(**args)


def hf_model(config: transformers.Qwen3Config, seed: int = 0) -> transformers.Qwen3ForCausalLM:
    torch.manual_seed(seed)
    model = transformers.Qwen3ForCausalLM(config).eval()
    # Random norms too, so a missed or transposed norm weight shows up in the logits.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    return model


def save_hf_qwen3(path, tie=False, rope="default", seed=0, dtype=torch.float32, **kw) -> str:
    """Save a random model plus a small byte-level BPE tokenizer to `path`."""
    model = hf_model(qwen3_config(tie=tie, rope=rope, attn_implementation="eager", **kw), seed)
    model.to(dtype).save_pretrained(str(path))
    tokenizer(model.config.vocab_size).save_pretrained(str(path))
    return str(path)


def tokenizer(vocab_size: int) -> transformers.PreTrainedTokenizerFast:
    """Byte-level BPE trained on a few sentences, `vocab_size` entries at most."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<pad>", "<bos>", "<eos>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()[:100]
    )
    text = ["def solve(question, solver):", "return solver.generate(question)", "the answer is 42"] * 20
    tok.train_from_iterator(text, trainer)
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", chat_template=CHAT_TEMPLATE
    )


def left_padded_batch(vocab: int, lengths: list[int], seed: int = 0):
    """-> tokens, attention_mask, positions: [B, T] int64 numpy, rows left-padded with token 0."""
    rng = np.random.default_rng(seed)
    T = max(lengths)
    tokens = np.zeros((len(lengths), T), np.int64)
    mask = np.zeros((len(lengths), T), np.int64)
    for b, n in enumerate(lengths):
        tokens[b, T - n :] = rng.integers(3, vocab, n)
        mask[b, T - n :] = 1
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    return tokens, mask, positions


def hf_logits(model, tokens, mask, positions) -> np.ndarray:
    with torch.no_grad():
        out = model(
            input_ids=torch.from_numpy(tokens),
            attention_mask=torch.from_numpy(mask),
            position_ids=torch.from_numpy(positions),
        )
    return out.logits.float().numpy()


def hf_greedy_texts(folder: str, prompts: list[str], n: int = 12) -> list[list[int]]:
    """transformers' greedy continuation ids of each text prompt (tokenized by the folder's tokenizer),
    EOS ignored: the reference the real-server tests compare against."""
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    out = []
    for p in prompts:
        ids = tok(p, return_tensors="pt").input_ids
        gen = model.generate(ids, max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
        out.append(gen[0, ids.shape[1]:].tolist())
    return out


def torch_sgd_step(ref, loss, lr: float) -> dict:
    """Backpropagate `loss` through transformers' `ref`, take one plain SGD step of `lr` on every
    parameter -> its state dict as numpy (the reference weights a train step must reach)."""
    loss.backward()
    with torch.no_grad():
        for p in ref.parameters():
            p -= lr * p.grad
    return {k: v.numpy() for k, v in ref.state_dict().items()}
