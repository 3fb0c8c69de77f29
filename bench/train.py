"""Train-step throughput, ours vs a PyTorch peer on the same weights and tokens, and achieved FLOP/s
as a fraction of a matmul peak measured in the same run.

    python bench/train.py [--size small] [--batch 8] [--length 512] [--steps 5] [--warmup 1]
                          [--mode sft|grpo|both] [--peer on|off] [--torch-compile] [--allow-load]
                          [--attention xla|kernel|both]

Each mode times one optimiser step (forward, backward, AdamW) on B x L tokens, half prompt and half
completion: `sft` minimises cross-entropy on the completion tokens, `grpo` the clipped-ratio policy
loss (token mean, eps 0.2, no KL) with given advantages and old log-probs (hljax/rl/grpo.py).

The peer is transformers' Qwen3ForCausalLM loaded from an HF export of our initial weights, at its
documented fast paths: sdpa attention, torch.optim.AdamW(fused=True) (foreach where fused is
missing), one thread per CPU, and `logits_to_keep` so only the completion's positions reach the
vocabulary projection (as TRL's GRPO trainer does). `--torch-compile` also times it under
torch.compile (compiling is not timed) and compares with the faster of the two. Both sides run the
same AdamW (lr 1e-4, optax's defaults: betas 0.9/0.999, eps 1e-8, weight decay 1e-4) without clipping.
`--attention kernel` runs our attention through the CPU kernel (`model.attention_kernel`,
hljax/kernels/cpu_attention.py) instead of XLA's programs; `both` times the two on the same weights,
one after the other, and compares the faster with the peer.

Model FLOPs per step are counted analytically (6 x matmul parameters x tokens for forward + backward,
plus attention's 12 x layers x T^2 x heads x head_dim per sequence), the same way MFU is usually
reported, and the same count for both sides (the peer skipping the prompt's logits does less work for
the same step); XLA's own count of our compiled step is printed beside it. The peak is the faster of
jax's and torch's fp32 2048^3 matmul. Warm-up steps (compiles) are not timed.
"""

import argparse
import dataclasses
import os
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch
import torch.nn.functional as F
import transformers
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import host  # noqa: E402
from hljax import sharding as shd  # noqa: E402
from hljax.checkpoint import hf  # noqa: E402
from hljax.kernels import cpu_attention  # noqa: E402
from hljax.models import qwen3  # noqa: E402
from hljax.models.config import ModelConfig, RopeConfig  # noqa: E402
from hljax.rl.batching import pack, split_micro  # noqa: E402
from hljax.rl.config import LossConfig  # noqa: E402
from hljax.rl.logprobs import Sequences  # noqa: E402
from hljax.rl.train_step import TrainBatch, batch_sharding, train_step  # noqa: E402

SIZES = {
    "tiny": dict(vocab_size=6720, hidden_size=128, intermediate_size=384, num_layers=2, num_heads=4, num_kv_heads=2,
                 head_dim=32),
    "tiny-deep": dict(vocab_size=6720, hidden_size=128, intermediate_size=384, num_layers=4, num_heads=4,
                      num_kv_heads=2, head_dim=32),  # configs/learning.py's proposer.
    "small": dict(vocab_size=8192, hidden_size=512, intermediate_size=1536, num_layers=8, num_heads=8,
                  num_kv_heads=4, head_dim=64),
}
LR, WEIGHT_DECAY = 1e-4, 1e-4  # optax.adamw's default weight decay, given to torch's AdamW too.


def matmul_peak(n=2048, reps=5) -> float:
    a = jnp.ones((n, n), jnp.float32)
    f = jax.jit(lambda x, y: x @ y)
    f(a, a).block_until_ready()
    best = min(_timed(lambda: f(a, a).block_until_ready()) for _ in range(reps))
    return 2 * n**3 / best


def torch_matmul_peak(n=2048, reps=5) -> float:
    a = torch.ones(n, n)
    a @ a
    return 2 * n**3 / min(_timed(lambda: a @ a) for _ in range(reps))


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def model_flops(cfg: ModelConfig, batch: int, length: int) -> float:
    D, F_, N, K, H, L = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                         cfg.num_layers)
    per_layer = D * N * H + 2 * D * K * H + N * H * D + 3 * D * F_
    matmul_params = L * per_layer + D * cfg.vocab_size  # The vocabulary projection counts once.
    tokens = batch * length
    attention = 12 * L * length * length * N * H * batch  # QK^T and PV, forward 4x, backward 8x.
    return 6 * matmul_params * tokens + attention


def make_batch(cfg: ModelConfig, B: int, L: int) -> dict[str, np.ndarray]:
    """B rows of a half-length prompt and a half-length completion, advantages, old log-probs."""
    rng = np.random.default_rng(0)
    seqs = pack([rng.integers(0, cfg.vocab_size, L // 2).tolist()] * B,
                [rng.integers(0, cfg.vocab_size, L // 2).tolist()] * B, L)
    return dict(tokens=seqs.tokens, attention_mask=seqs.attention_mask, loss_mask=seqs.loss_mask,
                advantages=rng.normal(size=B).astype(np.float32), old_logp=np.full((B, L), -5.0, np.float32))


class Ours:
    """Our jitted train step on our model; `step` returns the loss."""

    def __init__(self, model, mesh, data: dict, mode: str, chunk: int):
        self.model, self.mesh = model, mesh
        with shd.use_mesh(mesh):
            self.opt = nnx.Optimizer(model, optax.adamw(LR, weight_decay=WEIGHT_DECAY), wrt=nnx.Param)
        self.loss = LossConfig(mode=mode, logprob_chunk=chunk)
        m = lambda x: split_micro(np.asarray(x), 1)  # noqa: E731
        z = data["old_logp"]
        seqs = Sequences(tokens=data["tokens"], attention_mask=data["attention_mask"], loss_mask=data["loss_mask"])
        batch = TrainBatch(seqs=jax.tree.map(m, seqs), advantages=m(data["advantages"]), old_logp=m(z),
                           ref_logp=m(z), sampler_logp=m(z))
        with shd.use_mesh(mesh):
            self.batch = jax.device_put(batch, batch_sharding(mesh))

    def set_mode(self, mode: str):
        self.loss = dataclasses.replace(self.loss, mode=mode)

    def xla_flops(self) -> float:
        with shd.use_mesh(self.mesh):
            compiled = train_step.lower(self.model, self.opt, self.batch, self.loss).compile()
        return compiled.cost_analysis().get("flops", float("nan"))

    def step(self) -> float:
        with shd.use_mesh(self.mesh):
            return float(jax.block_until_ready(train_step(self.model, self.opt, self.batch, self.loss))["loss"])


class Torch:
    """transformers' Qwen3ForCausalLM from an HF folder, the same step in PyTorch."""

    def __init__(self, path: str, data: dict, mode: str, compile_: bool):
        self.model = transformers.Qwen3ForCausalLM.from_pretrained(path, attn_implementation="sdpa",
                                                                   dtype=torch.float32).train()
        params = list(self.model.parameters())
        try:
            self.opt = torch.optim.AdamW(params, lr=LR, weight_decay=WEIGHT_DECAY, fused=True)
            self.fused = "fused"
        except (RuntimeError, TypeError):  # Torch builds without a fused CPU AdamW.
            self.opt = torch.optim.AdamW(params, lr=LR, weight_decay=WEIGHT_DECAY, foreach=True)
            self.fused = "foreach"
        self.mode = mode
        self.forward = torch.compile(self.model, dynamic=False) if compile_ else self.model
        t = {k: torch.from_numpy(v) for k, v in data.items()}
        L = t["tokens"].shape[1]
        # Positions up to the first loss_mask position have no target in the loss: skip their logits.
        first = int(np.flatnonzero(data["loss_mask"].any(axis=0))[0])
        self.keep = L - first
        targets = torch.cat([t["tokens"][:, 1:], torch.zeros_like(t["tokens"][:, :1])], dim=1)
        self.ids, self.attention = t["tokens"].long(), t["attention_mask"].long()
        self.targets = targets[:, first:].long()
        self.mask = t["loss_mask"][:, first:]
        self.old = t["old_logp"][:, first:]
        self.adv = t["advantages"][:, None]

    def _loss(self) -> torch.Tensor:
        logits = self.forward(input_ids=self.ids, attention_mask=self.attention, logits_to_keep=self.keep).logits
        B, T, V = logits.shape
        logp = -F.cross_entropy(logits.float().reshape(B * T, V), self.targets.reshape(-1),
                                reduction="none").view(B, T)
        if self.mode == "sft":
            per_token = -logp
        else:  # grpo.clipped_surrogate with eps_low = eps_high = 0.2, then token_mean aggregation.
            ratio = torch.exp(logp - self.old)
            per_token = -torch.minimum(ratio * self.adv, torch.clamp(ratio, 0.8, 1.2) * self.adv)
        return (per_token * self.mask).sum() / self.mask.sum().clamp(min=1.0)

    def step(self) -> float:
        loss = self._loss()
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return float(loss.detach())


def timed_steps(side, warmup: int, steps: int) -> tuple[float, float]:
    """-> (first warm-up step's loss, mean seconds per timed step)."""
    first = side.step()
    for _ in range(warmup - 1):
        side.step()
    t = time.perf_counter()
    for _ in range(steps):
        side.step()
    return first, (time.perf_counter() - t) / steps


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small", choices=sorted(SIZES))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first (compiles)")
    parser.add_argument("--mode", default="both", choices=["sft", "grpo", "both"])
    parser.add_argument("--attention", default="xla", choices=["xla", "kernel", "both"],
                        help="our attention: XLA's programs or the CPU kernel (model.attention_kernel)")
    parser.add_argument("--peer", default="on", choices=["on", "off"])
    parser.add_argument("--torch-compile", action="store_true", help="also time the peer under torch.compile")
    host.add_args(parser)
    args = parser.parse_args()
    host.check_args(args)
    torch.set_num_threads(os.cpu_count())
    args.warmup = max(args.warmup, 1)

    jax_peak, torch_peak = matmul_peak(), torch_matmul_peak()
    peak = max(jax_peak, torch_peak)
    cfg = ModelConfig(**SIZES[args.size], rope=RopeConfig(theta=1e6), tie_word_embeddings=True)
    mesh = shd.make_mesh()
    model = qwen3.create(cfg, mesh)
    n_params = sum(x.size for x in jax.tree.leaves(nnx.state(model)))
    B, L = args.batch, args.length
    data = make_batch(cfg, B, L)
    modes = ["sft", "grpo"] if args.mode == "both" else [args.mode]
    ours = {}
    for name in ["xla", "kernel"] if args.attention == "both" else [args.attention]:
        on = cpu_attention.resolve("on" if name == "kernel" else "off", jnp.float32, cfg.head_dim, jax.device_count())
        m = qwen3.create(dataclasses.replace(cfg, attention_kernel=on), mesh)
        nnx.update(m, jax.tree.map(jnp.copy, nnx.state(model)))  # The same initial weights, own buffers.
        ours[name] = Ours(m, mesh, data, modes[0], LossConfig().logprob_chunk)
    peers = {}
    if args.peer == "on":
        with tempfile.TemporaryDirectory() as d:
            path = hf.save_hf(model, os.path.join(d, "model"), dtype="float32")  # Before any step changes it.
            peers["eager"] = Torch(path, data, modes[0], False)
            if args.torch_compile:
                peers["compile"] = Torch(path, data, modes[0], True)
    print(f"devices: {jax.device_count()} x {jax.devices()[0].platform}; matmul peak {peak / 1e9:.1f} GFLOP/s "
          f"(fp32 2048^3, same run: jax {jax_peak / 1e9:.1f}, torch {torch_peak / 1e9:.1f}); torch "
          f"{torch.__version__} ({torch.get_num_threads()} threads), transformers {transformers.__version__}",
          flush=True)
    flops = model_flops(cfg, B, L)
    for mode in modes:
        times = {}
        for name, side in ours.items():
            side.set_mode(mode)
            xla_flops = side.xla_flops()
            loss, times[name] = timed_steps(side, args.warmup, args.steps)
            dt = times[name]
            print(f"{args.size} {mode} ({n_params / 1e6:.1f} M params, {name} attention), batch {B} x {L} "
                  f"tokens: {dt * 1e3:.0f} ms/step, {B * L / dt:.0f} tokens/s, model {flops / dt / 1e9:.1f} GFLOP/s = "
                  f"{flops / dt / peak:.1%} of peak (XLA counts {xla_flops / 1e9:.1f} GFLOP/step, custom calls not "
                  f"included, vs model {flops / 1e9:.1f}) | first-step loss {loss:.5f}", flush=True)
        if len(times) == 2:
            print(f"{args.size} {mode}: kernel attention vs XLA attention: {times['xla'] / times['kernel']:5.2f}x the "
                  f"speed ({times['kernel'] * 1e3:.0f} vs {times['xla'] * 1e3:.0f} ms/step)", flush=True)
        fastest = min(times, key=times.get)
        dt = times[fastest]
        theirs = {}
        for name, peer in peers.items():
            peer.mode = mode
            their_loss, theirs[name] = timed_steps(peer, args.warmup, args.steps)
            t = theirs[name]
            print(f"{args.size} {mode} torch {name} (sdpa, {peer.fused} AdamW, logits_to_keep {peer.keep}): "
                  f"{t * 1e3:.0f} ms/step, {B * L / t:.0f} tokens/s, model {flops / t / 1e9:.1f} GFLOP/s = "
                  f"{flops / t / peak:.1%} of peak | first-step loss ours {loss:.5f}, torch {their_loss:.5f}",
                  flush=True)
        if theirs:
            best = min(theirs, key=theirs.get)
            print(f"{args.size} {mode}: ours ({fastest} attention) vs torch best ({best}): "
                  f"{theirs[best] / dt:5.2f}x the speed "
                  f"({dt * 1e3:.0f} vs {theirs[best] * 1e3:.0f} ms/step)", flush=True)


if __name__ == "__main__":
    main()
