"""Decode throughput of our JAX engine vs `transformers.generate` on the same random weights.

    python bench/generate.py [--sizes small,0.6b,q35-small,q35-0.8b] [--batches 1,8] [--prompt 64] [--new 32]

Sizes prefixed `q35-` are Qwen3.5 (hybrid Gated DeltaNet / gated attention, 3 linear layers per full
one); transformers runs them on its torch fallbacks (no flash-linear-attention kernels on CPU).

Prints, for both: end-to-end tokens/s (prefill + decode) and decode tokens/s (a run's time minus the
time of a 1-token run on the same prompts, i.e. without the prefill), the ratios of both, and our
decode steps/s as a fraction of the memory-bandwidth roofline (weight bytes read per step / numpy
copy bandwidth measured in this run). `--cpu-kernels off` measures our engine on XLA's dot alone.
"""

import argparse
import os
import sys
import tempfile
import time

import numpy as np
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hljax import sharding as shd  # noqa: E402
from hljax.checkpoint import hf  # noqa: E402
from hljax.generate.engine import Engine, EngineConfig, Request  # noqa: E402
from hljax.generate.types import SamplingParams  # noqa: E402

SIZES = {
    "small": dict(vocab_size=8192, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=64),
    "0.6b": dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "q35-small": dict(vocab_size=8192, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, linear_num_key_heads=4,
                      linear_num_value_heads=4, linear_key_head_dim=64, linear_value_head_dim=64),
    # Qwen3.5-0.8B's text shape as public configs give it (random weights; vocabulary included).
    "q35-0.8b": dict(vocab_size=248320, hidden_size=1024, intermediate_size=3584, num_hidden_layers=24,
                     num_attention_heads=8, num_key_value_heads=2, head_dim=256, linear_num_key_heads=16,
                     linear_num_value_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
                     tie_word_embeddings=True),
}


def reference_model(size: str):
    """transformers' model of `size` with seeded random weights."""
    torch.manual_seed(0)
    if size.startswith("q35-"):
        cfg = transformers.Qwen3_5TextConfig(**SIZES[size], max_position_embeddings=4096, rope_parameters={
            "rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25})
        return transformers.Qwen3_5ForCausalLM(cfg).eval()
    cfg = transformers.Qwen3Config(**SIZES[size], max_position_embeddings=4096, rope_parameters={
        "rope_type": "default", "rope_theta": 1e6})
    return transformers.Qwen3ForCausalLM(cfg).eval()


def copy_bandwidth(nbytes=512 * 2**20, reps=5) -> float:
    """Bytes/s of a numpy copy, read + write counted."""
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    best = min(_timed(lambda: np.copyto(dst, src)) for _ in range(reps))
    return 2 * nbytes / best


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def bench(size: str, batches, prompt_len: int, new: int, bandwidth: float, cpu_kernels: str):
    ref = reference_model(size)
    cfg = ref.config
    n_params = sum(p.numel() for p in ref.parameters())
    weight_bytes = 4 * n_params
    with tempfile.TemporaryDirectory() as d:
        ref.save_pretrained(d)
        mesh = shd.make_mesh()
        engine = Engine(hf.load_hf(d, mesh), mesh, EngineConfig(max_batch=max(batches), max_seq_len=prompt_len + new,
                                                                 cpu_kernels=cpu_kernels))
    print(f"{size}: our decode matmuls: {'hljax CPU kernels' if engine.kernels else 'XLA dot'}", flush=True)
    rng = np.random.default_rng(0)
    for B in batches:
        prompts = rng.integers(0, cfg.vocab_size, (B, prompt_len))
        reqs = [Request(tuple(p.tolist()), SamplingParams(max_new_tokens=new, temperature=0.0)) for p in prompts]
        engine.generate(reqs)  # compile
        ours = min(_timed(lambda: engine.generate(reqs)) for _ in range(2))
        # Decode alone: a 1-token run costs the prefill, subtract it.
        one = [Request(r.prompt_ids, SamplingParams(max_new_tokens=1, temperature=0.0)) for r in reqs]
        engine.generate(one)
        prefill = min(_timed(lambda: engine.generate(one)) for _ in range(2))
        steps_per_s = (new - 1) / max(ours - prefill, 1e-9)

        ids = torch.from_numpy(prompts)
        kw = dict(attention_mask=torch.ones_like(ids), do_sample=False, pad_token_id=0)
        with torch.no_grad():
            run = lambda n: ref.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)  # noqa: E731
            run(new)
            theirs = min(_timed(lambda: run(new)) for _ in range(2))
            their_prefill = min(_timed(lambda: run(1)) for _ in range(2))
        their_steps = (new - 1) / max(theirs - their_prefill, 1e-9)
        roofline = bandwidth / weight_bytes
        print(f"{size:>9} B={B}: end-to-end ours {B * new / ours:8.1f} tok/s | transformers {B * new / theirs:8.1f} tok/s | "
              f"ratio {theirs / ours:5.2f}x", flush=True)
        print(f"{size:>9} B={B}: decode     ours {B * steps_per_s:8.1f} tok/s | transformers {B * their_steps:8.1f} tok/s | "
              f"ratio {steps_per_s / their_steps:5.2f}x | prefill ours {prefill:.2f} s, transformers "
              f"{their_prefill:.2f} s | our decode {steps_per_s:6.2f} steps/s = {steps_per_s / roofline:5.1%} of roofline "
              f"({roofline:.2f} steps/s at {bandwidth / 1e9:.1f} GB/s, {weight_bytes / 1e9:.2f} GB fp32 weights)",
              flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="small,0.6b")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--cpu-kernels", default="auto", choices=["auto", "on", "off"])
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count())
    bandwidth = copy_bandwidth()
    print(f"numpy copy bandwidth: {bandwidth / 1e9:.1f} GB/s; torch {torch.__version__}, "
          f"transformers {transformers.__version__}")
    for size in args.sizes.split(","):
        bench(size, [int(b) for b in args.batches.split(",")], args.prompt, args.new, bandwidth, args.cpu_kernels)


if __name__ == "__main__":
    main()
