"""Decode throughput of our JAX engine vs `transformers.generate` on the same random weights.

    python bench/generate.py [--sizes small,0.6b,q35-small,q35-0.8b] [--batches 1,8] [--prompt 64] [--new 32]
                             [--dtypes fp32,bf16] [--peer on|off] [--no-compile] [--rss] [--allow-load]

Sizes prefixed `q35-` are Qwen3.5 (hybrid Gated DeltaNet / gated attention, 3 linear layers per full
one); transformers runs them on its torch fallbacks (no flash-linear-attention kernels on CPU).

Prints, for both: end-to-end tokens/s (prefill + decode) and decode tokens/s (a run's time minus the
time of a 1-token run on the same prompts, i.e. without the prefill), the ratios of both, and our
decode steps/s as a fraction of the memory-bandwidth roofline (weight bytes read per step / numpy
copy bandwidth measured in this run). `--cpu-kernels off` measures our engine on XLA's dot alone.
`--dtypes fp32,bf16` runs both sides with the same weights in each dtype (ours: `load_hf(dtype=...)`,
transformers: `.to(dtype)`), interleaved per batch size. `--peer off` skips transformers (for long
`--new`). `--rss` also loads our engine alone in a fresh process and reports its resident memory
after loading and after one generate, against the weights' bytes plus the KV cache.

The peer runs in each of its documented modes, in the same run: `dynamic` (generate's default
DynamicCache), `static` (`cache_implementation="static"`) and `static+compile` (the static cache with
`model.forward = torch.compile(...)`, transformers' recipe for fast decoding; `--no-compile` skips
it, compiling takes minutes). Each is warmed up (compiled) at the timed shapes before timing. The
first two lines per batch keep their old form against `dynamic`; the `ours vs transformers best`
line, against the fastest mode, is the headline. The host's load is checked first (bench/host.py).
"""

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import host  # noqa: E402
from hljax import sharding as shd  # noqa: E402
from hljax.checkpoint import hf  # noqa: E402
from hljax.generate.engine import Engine, EngineConfig, Request  # noqa: E402
from hljax.generate.types import SamplingParams  # noqa: E402

DTYPES = {"fp32": (torch.float32, "float32"), "bf16": (torch.bfloat16, "bfloat16")}

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


PEER_MODES = ("dynamic", "static", "static+compile")


def peer_modes(compile_: bool) -> list[str]:
    return [m for m in PEER_MODES if compile_ or "compile" not in m]


def _compiled_forward(model):
    """One compiled forward per model, kept: dynamo's guards tie compiled graphs to the compile call
    that made them, so a fresh `torch.compile` per use would recompile every time."""
    if "_bench_compiled" not in model.__dict__:
        # Every shape (batch, prompt; decode) and dtype is one more graph of the same code object (a
        # decorator's wrapper, shared with other models): past the default limit of 8 dynamo would
        # silently fall back to eager.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        # transformers' llm_optims recipe, with mode "default": "reduce-overhead" means CUDA graphs,
        # which inductor skips on CPU. dynamic=False: one graph per shape, as a static cache allows.
        model.__dict__["_bench_compiled"] = torch.compile(model.forward, mode="default", dynamic=False,
                                                          fullgraph=True)
    return model.__dict__["_bench_compiled"]


@contextlib.contextmanager
def peer_mode(model, mode: str):
    """Set `model` up for one of PEER_MODES; yields the extra `generate` kwargs."""
    if mode == "dynamic":
        yield {}
        return
    if "compile" not in mode:
        yield {"cache_implementation": "static"}
        return
    model.forward = _compiled_forward(model)
    try:
        yield {"cache_implementation": "static"}
    finally:
        del model.forward  # Back to the class's eager forward.


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


def bench(size: str, batches, prompt_len: int, new: int, bandwidth: float, cpu_kernels: str, dtypes, peer: bool,
          rss: bool, modes=PEER_MODES):
    import jax.numpy as jnp

    ref32 = reference_model(size)
    cfg = ref32.config
    n_params = sum(p.numel() for p in ref32.parameters())
    with tempfile.TemporaryDirectory() as d:
        ref32.save_pretrained(d)
        mesh = shd.make_mesh()
        sides = {}
        for name in dtypes:
            torch_dtype, jnp_name = DTYPES[name]
            engine = Engine(hf.load_hf(d, mesh, dtype=getattr(jnp, jnp_name)), mesh,
                            EngineConfig(max_batch=max(batches), max_seq_len=prompt_len + new, cpu_kernels=cpu_kernels))
            # A fresh seeded model per dtype: .to() converts in place.
            sides[name] = (engine, ref32 if name == "fp32" else reference_model(size).to(torch_dtype))
            print(f"{size} {name}: our matmuls: {'hljax CPU kernels' if engine.kernels else 'XLA dot'}", flush=True)
            if rss:
                engine_rss(d, jnp_name, cpu_kernels, max(batches), prompt_len, new, n_params, cfg)
        rng = np.random.default_rng(0)
        for B in batches:
            prompts = rng.integers(0, cfg.vocab_size, (B, prompt_len))
            for name, (engine, ref) in sides.items():
                weight_bytes = n_params * (4 if name == "fp32" else 2)
                run_one(f"{size} {name}", engine, ref if peer else None, prompts, new, bandwidth, weight_bytes, modes)


def run_one(label, engine, ref, prompts, new, bandwidth, weight_bytes, modes=PEER_MODES):
    B = len(prompts)
    reqs = [Request(tuple(p.tolist()), SamplingParams(max_new_tokens=new, temperature=0.0)) for p in prompts]
    engine.generate(reqs)  # compile
    ours = min(_timed(lambda: engine.generate(reqs)) for _ in range(2))
    # Decode alone: a 1-token run costs the prefill, subtract it.
    one = [Request(r.prompt_ids, SamplingParams(max_new_tokens=1, temperature=0.0)) for r in reqs]
    engine.generate(one)
    prefill = min(_timed(lambda: engine.generate(one)) for _ in range(2))
    steps_per_s = (new - 1) / max(ours - prefill, 1e-9)
    roofline = bandwidth / weight_bytes
    mine = (f"our decode {steps_per_s:6.2f} steps/s = {steps_per_s / roofline:5.1%} of roofline "
            f"({roofline:.2f} steps/s at {bandwidth / 1e9:.1f} GB/s, {weight_bytes / 1e9:.2f} GB weights)")
    if ref is None:
        print(f"{label} B={B} new={new}: end-to-end ours {B * new / ours:8.1f} tok/s | decode ours "
              f"{B * steps_per_s:8.1f} tok/s | prefill ours {prefill:.2f} s | {mine}", flush=True)
        return
    ids = torch.from_numpy(prompts)
    kw = dict(attention_mask=torch.ones_like(ids), do_sample=False, pad_token_id=0)
    peers = {}  # mode -> (end-to-end s, prefill s, decode steps/s)
    for mode in modes:
        try:
            with torch.no_grad(), peer_mode(ref, mode) as extra:
                run = lambda n: ref.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw, **extra)  # noqa: E731
                t = time.perf_counter()
                run(new)  # Warm-up: compiles both shapes (prefill, decode) for static+compile.
                run(1)
                warm = time.perf_counter() - t
                theirs = min(_timed(lambda: run(new)) for _ in range(2))
                their_prefill = min(_timed(lambda: run(1)) for _ in range(2))
        except Exception as e:  # A mode this model or host lacks (e.g. Qwen3.5's linear-attention cache).
            print(f"{label} B={B}: transformers {mode:<14} failed, left out: {type(e).__name__}: "
                  f"{str(e).splitlines()[0] if str(e) else ''}", flush=True)
            continue
        their_steps = (new - 1) / max(theirs - their_prefill, 1e-9)
        peers[mode] = (theirs, their_prefill, their_steps)
        print(f"{label} B={B}: transformers {mode:<14} end-to-end {B * new / theirs:8.1f} tok/s | decode "
              f"{B * their_steps:8.1f} tok/s | prefill {their_prefill:.2f} s | warm-up {warm:.1f} s (not timed)",
              flush=True)
    if not peers:
        return
    # The old two lines, against generate's default (dynamic cache), for comparison with earlier runs.
    base = "dynamic" if "dynamic" in peers else next(iter(peers))
    theirs, their_prefill, their_steps = peers[base]
    print(f"{label} B={B}: end-to-end ours {B * new / ours:8.1f} tok/s | transformers {B * new / theirs:8.1f} tok/s | "
          f"ratio {theirs / ours:5.2f}x", flush=True)
    print(f"{label} B={B}: decode     ours {B * steps_per_s:8.1f} tok/s | transformers {B * their_steps:8.1f} tok/s | "
          f"ratio {steps_per_s / their_steps:5.2f}x | prefill ours {prefill:.2f} s, transformers "
          f"{their_prefill:.2f} s | {mine}", flush=True)
    e2e = min(peers, key=lambda m: peers[m][0])
    dec = max(peers, key=lambda m: peers[m][2])
    print(f"{label} B={B}: ours vs transformers best end-to-end ({e2e}): {peers[e2e][0] / ours:5.2f}x | "
          f"decode ({dec}): {steps_per_s / peers[dec][2]:5.2f}x", flush=True)


_RSS_SCRIPT = """
import sys, numpy as np, jax.numpy as jnp
from hljax import sharding as shd
from hljax.checkpoint import hf
from hljax.generate.engine import Engine, EngineConfig, Request
from hljax.generate.types import SamplingParams
def rss():
    fields = dict(l.split(':', 1) for l in open('/proc/self/status'))
    return [int(fields[k].split()[0]) * 1024 for k in ('VmRSS', 'VmHWM')]
path, dtype, kernels, B, P, N = sys.argv[1:7]
B, P, N = int(B), int(P), int(N)
mesh = shd.make_mesh()
e = Engine(hf.load_hf(path, mesh, dtype=getattr(jnp, dtype)), mesh, EngineConfig(max_batch=B, max_seq_len=P + N,
           cpu_kernels=kernels))
loaded = rss()
e.generate([Request(tuple(range(1, P + 1)), SamplingParams(max_new_tokens=N, temperature=0.0))] * B)
print(*loaded, *rss())
"""


def engine_rss(path, dtype, cpu_kernels, B, prompt_len, new, n_params, cfg):
    """Resident bytes of a fresh process holding only our engine, after load and after one generate."""
    out = subprocess.run([sys.executable, "-c", _RSS_SCRIPT, path, dtype, cpu_kernels, str(B), str(prompt_len),
                          str(new)], capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    loaded, loaded_peak, after, after_peak = (int(v) for v in out.stdout.split()[-4:])
    size = 4 if dtype == "float32" else 2
    weights = n_params * size
    S = 1 << max(4, (prompt_len + new - 1).bit_length())  # The engine's cache bucket (upper bound).
    kv = 2 * cfg.num_hidden_layers * B * cfg.num_key_value_heads * S * cfg.head_dim * size
    print(f"  RSS ({dtype}, engine alone): after load {loaded / 1e9:.2f} GB (peak {loaded_peak / 1e9:.2f}), after a "
          f"B={B} generate {after / 1e9:.2f} GB (peak {after_peak / 1e9:.2f}); weights {weights / 1e9:.2f} GB + KV "
          f"cache {kv / 1e9:.2f} GB -> {after / (weights + kv):.2f}x", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="small,0.6b")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--cpu-kernels", default="auto", choices=["auto", "on", "off"])
    parser.add_argument("--dtypes", default="fp32")
    parser.add_argument("--peer", default="on", choices=["on", "off"])
    parser.add_argument("--no-compile", action="store_true", help="skip the static+compile peer (compiles for minutes)")
    parser.add_argument("--rss", action="store_true")
    host.add_args(parser)
    args = parser.parse_args()
    host.check_args(args)
    torch.set_num_threads(os.cpu_count())
    bandwidth = copy_bandwidth()
    print(f"numpy copy bandwidth: {bandwidth / 1e9:.1f} GB/s; torch {torch.__version__}, "
          f"transformers {transformers.__version__}")
    for size in args.sizes.split(","):
        bench(size, [int(b) for b in args.batches.split(",")], args.prompt, args.new, bandwidth, args.cpu_kernels,
              args.dtypes.split(","), args.peer == "on", args.rss, peer_modes(not args.no_compile))


if __name__ == "__main__":
    main()
