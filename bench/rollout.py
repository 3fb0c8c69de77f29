"""The GRPO rollout workload: P prompts x G samples, hljax vs `transformers.generate`, in one run.

    python bench/rollout.py [--size 0.6b] [--prompts 4] [--samples 8] [--prompt-len 1000] [--new 128]
                            [--dtypes float32,bfloat16] [--layers N] [--stagger 0.5] [--http] [--sglang-jax]
                            [--no-compile] [--allow-load]

Same random weights for both (a `bench/generate.py` size, `--layers` to shrink it). Every completion
is `--new` tokens long (ignore_eos / min_new_tokens), sampled at temperature 1 with no top-k/top-p.
- batch: all P x G rows at once. hljax gets the P prompts with n = G (each prompt prefilled once,
  its cache copied to its G slots); transformers gets `generate(num_return_sequences=G)` on the P
  prompts. Prints tokens/s (P x G x new / time to the last completion), the time, the prompt tokens
  each prefilled, and hljax / transformers ratios.
- staggered (`--stagger S`): the P requests (G samples each) arrive S seconds apart. hljax serves them
  through its continuous batch (requests join the running decode); transformers, which has no server,
  one `generate` at a time, each as soon as the previous finished. Time to the last completion.
`--http` also runs the batch case through our SGLang-compatible server and client; `--sglang-jax` on
sglang-jax (the JAX SGLang, real; CPU here) serving the same folder, with log-probs, as GRPO asks.

transformers runs the batch case in each of its modes (bench/generate.py's PEER_MODES: dynamic cache,
static cache, static cache + torch.compile; `--no-compile` skips the last), each warmed up at the
timed shapes (a 3-token run of the same prompts into a cache of the timed length), so compiling is
not timed. The `ours vs transformers best` line, against the fastest mode, is the headline; the
older line stays against the dynamic cache. The staggered case runs transformers in the best mode.
"""

import argparse
import os
import sys
import tempfile
import time

import jax.numpy as jnp
import numpy as np
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import host  # noqa: E402
from bench.generate import PEER_MODES, SIZES, peer_mode, peer_modes  # noqa: E402
from hljax import sharding as shd  # noqa: E402
from hljax.checkpoint import hf  # noqa: E402
from hljax.generate.engine import Engine, EngineConfig  # noqa: E402
from hljax.generate.local import expand  # noqa: E402
from hljax.generate.batcher import Batcher  # noqa: E402
from hljax.generate.types import SamplingParams  # noqa: E402


def reference_model(size: str, layers: int | None):
    torch.manual_seed(0)
    shape = {**SIZES[size], **({"num_hidden_layers": layers} if layers else {})}
    cfg = transformers.Qwen3Config(**shape, max_position_embeddings=8192,
                                   rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    return transformers.Qwen3ForCausalLM(cfg).eval()


def _timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def hljax_batch(engine, prompts, G, new):
    sp = SamplingParams(max_new_tokens=new, temperature=1.0, seed=0, ignore_eos=True)
    before = engine.stats.prompt_tokens_prefilled
    secs, outs = _timed(lambda: engine.generate(expand(prompts, sp, G)))
    assert all(len(o.token_ids) == new for o in outs)
    return secs, engine.stats.prompt_tokens_prefilled - before


def hf_generate(model, prompts, G, new, **extra):
    ids = torch.tensor(prompts)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_k=0,
                             top_p=1.0, max_new_tokens=new, min_new_tokens=new, num_return_sequences=G,
                             pad_token_id=0, **extra)
    assert out.shape == (len(prompts) * G, ids.shape[1] + new)


def static_len(extra: dict, length: int) -> dict:
    """A static cache of the timed length even in a shorter warm-up run, so that the warm-up compiles
    the graphs the timed run uses (a static cache's length is part of every shape)."""
    return {**extra, "max_cache_len": length} if extra.get("cache_implementation") == "static" else extra


def hf_modes(model, dtype, prompts, G, new, modes=PEER_MODES) -> dict[str, float]:
    """The batch case in each of transformers' modes -> {mode: seconds}; a mode that fails is left out."""
    tok = len(prompts) * G * new
    peers = {}
    for mode in modes:
        try:
            with peer_mode(model, mode) as extra:
                extra = static_len(extra, len(prompts[0]) + new)
                # Same shapes, fewer tokens: the prefill and (past the first token) the decode graphs.
                warm, _ = _timed(lambda: hf_generate(model, prompts, G, min(3, new), **extra))
                peers[mode], _ = _timed(lambda: hf_generate(model, prompts, G, new, **extra))
        except Exception as e:  # A mode this model or host lacks.
            print(f"{dtype:>9} batch: transformers {mode:<14} failed, left out: {type(e).__name__}: "
                  f"{str(e).splitlines()[0] if str(e) else ''}", flush=True)
            continue
        print(f"{dtype:>9} batch: transformers {mode:<14} {tok / peers[mode]:7.1f} tok/s ({peers[mode]:6.1f} s; "
              f"warm-up {warm:.1f} s, not timed)", flush=True)
    if not peers:
        raise RuntimeError("every transformers mode failed")
    return peers


def hljax_staggered(engine, prompts, G, new, stagger):
    """Requests arrive `stagger` s apart and join the running batch; -> time to the last completion."""
    sp = SamplingParams(max_new_tokens=new, temperature=1.0, seed=0, ignore_eos=True)
    batcher, tickets, t0 = Batcher(engine), [], time.perf_counter()
    while len(tickets) < len(prompts) or not all(t.done for t in tickets):
        now = time.perf_counter() - t0
        while len(tickets) < len(prompts) and now >= len(tickets) * stagger:
            tickets.append(batcher.add(expand([prompts[len(tickets)]], sp, G)))
        if batcher.idle:
            time.sleep(max(0.0, len(tickets) * stagger - now))
        else:
            batcher.step()
    return time.perf_counter() - t0


def hf_staggered(model, prompts, G, new, stagger, **extra):
    """One generate at a time, each starting when its request has arrived and the previous is done."""
    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        time.sleep(max(0.0, i * stagger - (time.perf_counter() - t0)))
        hf_generate(model, [p], G, new, **extra)
    return time.perf_counter() - t0


def hljax_http(engine, tokenizer, path, prompts, G, new):
    from hljax.generate.client import ClientConfig, SGLangGenerator
    from hljax.generate.local import LocalGenerator
    from hljax.generate.server import Server

    with Server(LocalGenerator(engine, tokenizer), path) as server:
        client = SGLangGenerator(server.url, config=ClientConfig(batch_size=len(prompts) * G))
        sp = SamplingParams(max_new_tokens=new, temperature=1.0, seed=0, ignore_eos=True)
        client.generate_ids(prompts, sp, n=G)  # Compiles at this batch's buckets.
        secs, _ = _timed(lambda: client.generate_ids(prompts, sp, n=G))
    return secs


def sglang_jax_batch(path, dtype, prompts, G, new, max_batch):
    """The batch case on sglang-jax (its own venv, scripts/sglang_jax.sh setup) serving the same folder:
    P requests of G copies, sent at once (the client sends one copy per request; the server batches
    them), log-probs returned as GRPO needs them. -> (seconds, start-up seconds)."""
    from hljax.generate.sglang_jax import ManagedSGLangJax

    L = len(prompts[0])
    # sglang-jax refuses prompt + new == context length ("exceeds ... of 576 tokens ... a total of 576").
    server = ManagedSGLangJax(path, None, max_batch=max_batch, max_seq_len=L + new + 1,
                              pool_tokens=len(prompts) * G * (L + new), dtype=dtype,
                              extra_args=("--skip-tokenizer-init",), log_path=os.path.join(path, "sglang-jax.log"))
    try:
        sp = SamplingParams(max_new_tokens=new, temperature=1.0, seed=0, ignore_eos=True)
        server.generate_ids(prompts, sp, n=G, return_logprobs=True)  # Warm-up, as for ours.
        secs, _ = _timed(lambda: server.generate_ids(prompts, sp, n=G, return_logprobs=True))
    finally:
        server.stop()
    return secs, server.restart_s[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="0.6b", choices=sorted(SIZES))
    parser.add_argument("--layers", type=int, default=None, help="fewer decoder layers (a quicker run)")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=1000)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--max-batch", type=int, default=32, help="hljax decode slots")
    parser.add_argument("--stagger", type=float, default=0.0, help="seconds between arrivals (0: skip)")
    parser.add_argument("--http", action="store_true", help="also through our HTTP server")
    parser.add_argument("--sglang-jax", action="store_true", help="also on sglang-jax (a size with head_dim 128)")
    parser.add_argument("--no-compile", action="store_true", help="skip transformers' static+compile mode")
    host.add_args(parser)
    args = parser.parse_args()
    host.check_args(args)
    torch.set_num_threads(os.cpu_count())
    P, G, L, new = args.prompts, args.samples, args.prompt_len, args.new
    tok = P * G * new  # Completion tokens of one run.
    ref = reference_model(args.size, args.layers)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, ref.config.vocab_size, L).tolist() for _ in range(P)]
    print(f"{args.size} ({ref.config.num_hidden_layers} layers, {sum(p.numel() for p in ref.parameters()) / 1e6:.0f} M "
          f"params): {P} prompts x {G} samples, prompt {L}, {new} new tokens, sampled; torch {torch.__version__}, "
          f"transformers {transformers.__version__}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}", flush=True)
    mesh = shd.make_mesh()
    with tempfile.TemporaryDirectory() as d:
        ref.save_pretrained(d)
        tokenizer = None
        for dtype in args.dtypes.split(","):
            tdt, jdt = getattr(torch, dtype), getattr(jnp, dtype)
            engine = Engine(hf.load_hf(d, mesh, dtype=jdt), mesh,
                            EngineConfig(max_batch=args.max_batch, max_seq_len=L + new))
            hljax_batch(engine, prompts, G, new)  # Compiles.
            ours, prefilled = hljax_batch(engine, prompts, G, new)
            print(f"{dtype:>9} batch: hljax {tok / ours:7.1f} tok/s ({ours:6.1f} s, prefilled {prefilled} prompt "
                  f"tokens); transformers next", flush=True)
            model = ref.to(tdt)
            peers = hf_modes(model, dtype, prompts, G, new, peer_modes(not args.no_compile))
            base = "dynamic" if "dynamic" in peers else next(iter(peers))
            theirs = peers[base]
            print(f"{dtype:>9} batch: hljax {tok / ours:7.1f} tok/s ({ours:6.1f} s, prefilled {prefilled} prompt "
                  f"tokens) | transformers {tok / theirs:7.1f} tok/s ({theirs:6.1f} s, prefilled {P * G * L}) | "
                  f"ratio {theirs / ours:5.2f}x", flush=True)
            best = min(peers, key=peers.get)
            print(f"{dtype:>9} batch: ours vs transformers best ({best}): {peers[best] / ours:5.2f}x", flush=True)
            if args.http:
                if tokenizer is None:
                    from tests.tiny import tokenizer as make_tokenizer
                    tokenizer = make_tokenizer(256)
                    engine.tokenizer = tokenizer
                secs = hljax_http(engine, tokenizer, d, prompts, G, new)
                print(f"{dtype:>9} batch over HTTP: hljax {tok / secs:7.1f} tok/s ({secs:6.1f} s)", flush=True)
            if args.sglang_jax:
                secs, start = sglang_jax_batch(d, dtype, prompts, G, new, max(args.max_batch, P * G))
                print(f"{dtype:>9} batch: hljax {tok / ours:7.1f} tok/s | sglang-jax {tok / secs:7.1f} tok/s "
                      f"({secs:6.1f} s; started in {start:.0f} s) | ratio {secs / ours:5.2f}x", flush=True)
            if args.stagger > 0:
                hljax_staggered(engine, prompts[:1], G, new, 0.0)  # Compiles the one-request buckets.
                ours = hljax_staggered(engine, prompts, G, new, args.stagger)
                with peer_mode(model, best) as extra:
                    extra = static_len(extra, L + new)
                    hf_generate(model, prompts[:1], G, min(3, new), **extra)  # Warm-up at one request's shapes.
                    theirs = hf_staggered(model, prompts, G, new, args.stagger, **extra)
                print(f"{dtype:>9} staggered {args.stagger:g} s: time to last completion hljax {ours:6.1f} s | "
                      f"transformers ({best}) {theirs:6.1f} s | ratio {theirs / ours:5.2f}x", flush=True)


if __name__ == "__main__":
    main()
