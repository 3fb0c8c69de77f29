"""A GRPO step's log-prob recompute and train step with each group's prompt run once
(grpo.share_prompts) against every row carrying its whole prompt, same weights, same rows, same run.

    python bench/shared_prompts.py [--size tiny] [--prompts 5] [--group 4] [--prompt-len 1650]
                                   [--completion-len 104] [--steps 3] [--allow-load]

The defaults are the tiny default's GRPO step (configs/tiny.py: 5 prompts x 4 candidates, prompts of
harness + report about 1,650 tokens, edits about 104). Both layouts get the same AdamW step from the
same weights, so the first step's loss must agree (printed); the ratio is whole rows / shared.
Warm-up steps (compiles) are not timed.
"""

import argparse
import os
import sys
import time

import jax
import numpy as np
import optax
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import host  # noqa: E402
from bench.train import SIZES  # noqa: E402
from hljax import sharding as shd  # noqa: E402
from hljax.models import qwen3  # noqa: E402
from hljax.models.config import ModelConfig, RopeConfig  # noqa: E402
from hljax.rl.batching import bucket_length, pack, pack_prefixes, shared_prompts, split_micro  # noqa: E402
from hljax.rl.config import LossConfig  # noqa: E402
from hljax.rl.logprobs import Prefix  # noqa: E402
from hljax.rl.train_step import TrainBatch, global_batch, local_logprobs, train_step  # noqa: E402


def layouts(cfg: ModelConfig, P: int, G: int, prompt_len: int, completion_len: int):
    """-> {name: (Sequences, Prefix or None)} of the same P x G rows, completions of
    lengths spread around completion_len (as sampled edits are)."""
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, cfg.vocab_size, prompt_len - rng.integers(0, 64)).tolist() for _ in range(P)]
    rows = [p for p in prompts for _ in range(G)]
    completions = [rng.integers(0, cfg.vocab_size, max(1, int(rng.normal(completion_len, completion_len / 4)))).tolist()
                   for _ in rows]
    whole = pack(rows, completions, bucket_length(max(len(p) + len(c) for p, c in zip(rows, completions))))
    prefixes, starts = shared_prompts(rows, G)
    shared = pack(starts, completions, bucket_length(max(len(c) + 1 for c in completions)))
    prefix = Prefix(*pack_prefixes(prefixes, bucket_length(max(map(len, prefixes)))))
    return {"whole rows": (whole, None), "shared prompts": (shared, prefix)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="tiny", choices=sorted(SIZES))
    parser.add_argument("--prompts", type=int, default=5)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=1650)
    parser.add_argument("--completion-len", type=int, default=104)
    parser.add_argument("--chunk", type=int, default=128, help="loss.logprob_chunk")
    parser.add_argument("--steps", type=int, default=3)
    host.add_args(parser)
    args = parser.parse_args()
    host.check_args(args)

    cfg = ModelConfig(**SIZES[args.size], rope=RopeConfig(theta=1e6), tie_word_embeddings=True)
    mesh = shd.make_mesh()
    B = args.prompts * args.group
    loss_cfg = LossConfig(mode="grpo", logprob_chunk=args.chunk)
    adv = np.random.default_rng(1).normal(size=B).astype(np.float32)
    times = {}
    for name, (seqs, prefix) in layouts(cfg, args.prompts, args.group, args.prompt_len, args.completion_len).items():
        model = qwen3.create(cfg, mesh, seed=0)
        with shd.use_mesh(mesh):
            opt = nnx.Optimizer(model, optax.adamw(1e-4), wrt=nnx.Param)

        def recompute():
            return local_logprobs(model, mesh, seqs, B, 1, 1.0, args.chunk, prefix)

        old = recompute()
        m = lambda x: split_micro(np.asarray(x), 1)  # noqa: E731
        batch = TrainBatch(seqs=jax.tree.map(m, seqs), advantages=m(adv), old_logp=m(old), ref_logp=m(old),
                           sampler_logp=m(old), prefix=None if prefix is None else jax.tree.map(m, prefix))
        batch = global_batch(batch, mesh, B)

        def step():
            with shd.use_mesh(mesh):
                return float(jax.block_until_ready(train_step(model, opt, batch, loss_cfg))["loss"])

        first = step()
        t = time.perf_counter()
        for _ in range(args.steps):
            step()
        dt_train = (time.perf_counter() - t) / args.steps
        recompute()
        t = time.perf_counter()
        for _ in range(args.steps):
            recompute()
        dt_lp = (time.perf_counter() - t) / args.steps
        shape = f"[{B}, {seqs.tokens.shape[1]}]" + ("" if prefix is None else f" + prefixes [{args.prompts}, {prefix.tokens.shape[1]}]")
        print(f"{name:>14}: rows {shape}: train step {dt_train * 1e3:.0f} ms, log-prob recompute {dt_lp * 1e3:.0f} ms, "
              f"first-step loss {first:.6f}", flush=True)
        times[name] = (dt_train, dt_lp)
    (wt, wl), (st, sl) = times["whole rows"], times["shared prompts"]
    print(f"{args.size}, {args.prompts} prompts x {args.group}, prompt ~{args.prompt_len} + completion ~{args.completion_len}: "
          f"shared prompts {wt / st:.2f}x the train step's speed, {wl / sl:.2f}x the recompute's", flush=True)


if __name__ == "__main__":
    main()
