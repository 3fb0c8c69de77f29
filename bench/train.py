"""Train-step throughput (tokens/s) and achieved FLOP/s as a fraction of a matmul peak measured
in the same run.

    python bench/train.py [--size small] [--batch 8] [--length 512] [--steps 5]

Model FLOPs per step are counted analytically (6 x matmul parameters x tokens for forward + backward,
plus attention's 12 x layers x T^2 x heads x head_dim per sequence), the same way MFU is usually
reported; XLA's own count of the compiled step is printed beside it.
"""

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hljax import sharding as shd  # noqa: E402
from hljax.models import qwen3  # noqa: E402
from hljax.models.config import ModelConfig, RopeConfig  # noqa: E402
from hljax.rl.batching import pack, split_micro  # noqa: E402
from hljax.rl.config import LossConfig  # noqa: E402
from hljax.rl.train_step import TrainBatch, batch_sharding, train_step  # noqa: E402

SIZES = {
    "tiny": dict(vocab_size=6720, hidden_size=128, intermediate_size=384, num_layers=2, num_heads=4, num_kv_heads=2,
                 head_dim=32),
    "small": dict(vocab_size=8192, hidden_size=512, intermediate_size=1536, num_layers=8, num_heads=8,
                  num_kv_heads=4, head_dim=64),
}


def matmul_peak(n=2048, reps=5) -> float:
    a = jnp.ones((n, n), jnp.float32)
    f = jax.jit(lambda x, y: x @ y)
    f(a, a).block_until_ready()
    best = min(_timed(lambda: f(a, a).block_until_ready()) for _ in range(reps))
    return 2 * n**3 / best


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def model_flops(cfg: ModelConfig, batch: int, length: int) -> float:
    D, F, N, K, H, L = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                        cfg.num_layers)
    per_layer = D * N * H + 2 * D * K * H + N * H * D + 3 * D * F
    matmul_params = L * per_layer + D * cfg.vocab_size  # The vocabulary projection counts once.
    tokens = batch * length
    attention = 12 * L * length * length * N * H * batch  # QK^T and PV, forward 4x, backward 8x.
    return 6 * matmul_params * tokens + attention


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small", choices=sorted(SIZES))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()

    peak = matmul_peak()
    cfg = ModelConfig(**SIZES[args.size], rope=RopeConfig(theta=1e6), tie_word_embeddings=True)
    mesh = shd.make_mesh()
    model = qwen3.create(cfg, mesh)
    with shd.use_mesh(mesh):
        opt = nnx.Optimizer(model, optax.adamw(1e-4), wrt=nnx.Param)
    rng = np.random.default_rng(0)
    B, L = args.batch, args.length
    seqs = pack([rng.integers(0, cfg.vocab_size, L // 2).tolist()] * B,
                [rng.integers(0, cfg.vocab_size, L // 2).tolist()] * B, L)
    m = lambda x: split_micro(np.asarray(x), 1)  # noqa: E731
    z = np.zeros((B, L), np.float32)
    batch = TrainBatch(seqs=jax.tree.map(m, seqs), advantages=m(rng.normal(size=B).astype(np.float32)),
                       old_logp=m(z - 5), ref_logp=m(z - 5), sampler_logp=m(z - 5))
    loss = LossConfig(mode="grpo", logprob_chunk=min(L, 512))
    with shd.use_mesh(mesh):
        batch = jax.device_put(batch, batch_sharding(mesh))
        xla_flops = train_step.lower(model, opt, batch, loss).compile().cost_analysis().get("flops", float("nan"))
        jax.block_until_ready(train_step(model, opt, batch, loss))  # compile
        t = time.perf_counter()
        for _ in range(args.steps):
            jax.block_until_ready(train_step(model, opt, batch, loss))
        dt = (time.perf_counter() - t) / args.steps
    flops = model_flops(cfg, B, L)
    n_params = sum(x.size for x in jax.tree.leaves(nnx.state(model)))
    print(f"devices: {jax.device_count()} x {jax.devices()[0].platform}; matmul peak {peak / 1e9:.1f} GFLOP/s "
          f"(fp32 2048^3, same run)")
    print(f"{args.size} ({n_params / 1e6:.1f} M params), batch {B} x {L} tokens: {dt * 1e3:.0f} ms/step, "
          f"{B * L / dt:.0f} tokens/s, model {flops / dt / 1e9:.1f} GFLOP/s = {flops / dt / peak:.1%} of peak "
          f"(XLA counts {xla_flops / 1e9:.1f} GFLOP/step vs model {flops / 1e9:.1f})")


if __name__ == "__main__":
    main()
