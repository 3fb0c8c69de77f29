"""One jitted, sharded optimiser step with exact gradient accumulation over micro-batches.

Multi-process: each process supplies only its rows of a step's batch (`process_rows` says which,
from the batch sharding), and `global_batch` assembles the global arrays the step consumes.
"""

from __future__ import annotations

import functools
import math

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from hljax import distributed as dist
from hljax import sharding as shd
from hljax.models.qwen3 import Qwen3
from hljax.rl import grpo, sft
from hljax.rl.batching import split_micro
from hljax.rl.config import LossConfig, OptimConfig
from hljax.rl.logprobs import Prefix, Sequences, sequence_logprobs


@flax.struct.dataclass
class TrainBatch:
    """Leading axis: micro-batches, accumulated in one step."""

    seqs: Sequences  # fields [M, b, L]
    advantages: jax.Array  # [M, b] fp32 (unused by SFT)
    old_logp: jax.Array  # [M, b, L] fp32: policy log-probs before this batch's first update
    ref_logp: jax.Array  # [M, b, L] fp32: reference log-probs (zeros when beta == 0)
    # [M, b, L] fp32: the sampler's log-probs of the completion tokens, aligned as old_logp (old_logp
    # where it gave none); read only with loss.tis_cap.
    sampler_logp: jax.Array
    # [M, p, Lp]: each group's shared prompt prefix when `seqs` hold only the rows' own tokens
    # (grpo.share_prompts); None when every row carries its whole prompt (SFT).
    prefix: Prefix | None = None


def make_optimizer(cfg: OptimConfig) -> optax.GradientTransformation:
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0 if cfg.warmup_steps else cfg.learning_rate,
        peak_value=cfg.learning_rate,
        warmup_steps=cfg.warmup_steps,
        decay_steps=cfg.warmup_steps + max(cfg.decay_steps, 1),
        end_value=cfg.learning_rate * cfg.final_lr_ratio,
    )
    adamw = optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay)
    return optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), adamw) if cfg.max_grad_norm else adamw


def batch_sharding(mesh: jax.sharding.Mesh) -> NamedSharding:
    """[M, b, ...] arrays: micro-batch rows split over the data-parallel axes."""
    return NamedSharding(mesh, P(None, (shd.DATA, shd.FSDP)))


def process_rows(mesh: jax.sharding.Mesh, batch_size: int, n_micro: int) -> np.ndarray:
    """Positions in a step's [batch_size] rows (micro-batch m holds rows m*b .. m*b+b-1) that this
    process supplies, in the order of its local [n_micro, b_local] block. One process: all rows."""
    if batch_size % n_micro:
        raise ValueError(f"batch of {batch_size} rows does not split into {n_micro} micro-batches")
    b = batch_size // n_micro
    shards = shd.axes_size(mesh, (shd.DATA, shd.FSDP))
    if b % shards:
        raise ValueError(f"a micro-batch of {b} rows does not split over the {shards} data-parallel devices "
                         f"(mesh data x fsdp); make batch / micro_batches a multiple of {shards}")
    cols = dist.local_rows(batch_sharding(mesh), (n_micro, b), axis=1)
    return (np.arange(n_micro)[:, None] * b + cols[None, :]).reshape(-1)


def share_group(mesh: jax.sharding.Mesh, batch_size: int, n_micro: int, group_size: int) -> int:
    """How many consecutive rows share one prompt prefix in the step's layout: the group, or the
    part of it that one data-parallel device holds (the rows' gcd with it), so that prefixes split
    over the devices exactly as their rows do. 1 when each device holds a single row."""
    per_device = batch_size // n_micro // shd.axes_size(mesh, (shd.DATA, shd.FSDP))
    return math.gcd(group_size, max(per_device, 1))


def global_batch(local: TrainBatch, mesh: jax.sharding.Mesh, batch_size: int) -> TrainBatch:
    """This process's [M, b_local, ...] rows (those of `process_rows`) -> the global [M, b, ...] batch;
    its prefixes ([M, b_local / g, ...], g from `share_group`) likewise."""

    sharding = batch_sharding(mesh)

    def to_global(tree, rows):
        return jax.tree.map(lambda x: dist.global_array(x, sharding, (x.shape[0], rows // x.shape[0], *x.shape[2:])),
                            tree)

    out = to_global(local.replace(prefix=None), batch_size)
    if local.prefix is None:
        return out
    group = local.seqs.tokens.shape[1] // local.prefix.tokens.shape[1]  # `share_group`'s
    return out.replace(prefix=to_global(local.prefix, batch_size // group))


def _loss(params, graphdef, micro: TrainBatch, cfg: LossConfig):
    model = nnx.merge(graphdef, params)
    logp, entropy = sequence_logprobs(model, micro.seqs, temperature=cfg.temperature, chunk=cfg.logprob_chunk,
                                      masked_only=True, prefix=micro.prefix)
    mask = micro.seqs.loss_mask
    if cfg.mode == "sft":
        loss_sum, denom = sft.masked_cross_entropy(logp, mask)
        metrics = {"tokens": mask.sum()}
    else:
        weight = grpo.truncated_is_weight(micro.old_logp, micro.sampler_logp, cfg.tis_cap) if cfg.tis_cap else None
        loss_sum, denom, metrics = grpo.grpo_loss(
            logp, micro.old_logp, micro.ref_logp if cfg.beta > 0 else None, micro.advantages, mask,
            eps_low=cfg.eps_low, eps_high=cfg.eps_high, beta=cfg.beta, kl_estimator=cfg.kl_estimator,
            aggregation=cfg.aggregation, max_tokens=cfg.max_tokens, is_weight=weight,
        )
        if weight is not None:  # Tokens whose weight the cap cut: how far the sampler strays.
            metrics["tis/capped_frac"] = ((micro.old_logp - micro.sampler_logp > jnp.log(cfg.tis_cap)) * mask).sum()
    metrics["entropy"] = (entropy * mask).sum()
    metrics["policy_drift"] = (jnp.abs(logp - micro.old_logp) * mask).sum()  # 0 at the first of mu updates
    return loss_sum, (denom, metrics)


def mean_metrics(updates: list[dict[str, float]]) -> dict[str, float]:
    """The metrics of the `grpo.mu` updates of one batch -> one row: each key's mean over the updates
    (TRL logs the mean over the optimiser steps of a logging step). At mu > 1 the first update has
    ratio 1 and clip fraction 0, so the mean clip fraction is what the later updates clip, diluted."""
    return {k: sum(u[k] for u in updates) / len(updates) for k in updates[0]}


@functools.partial(nnx.jit, static_argnames=("cfg",), donate_argnames=("model", "optimizer"))
def train_step(model: Qwen3, optimizer: nnx.Optimizer, batch: TrainBatch, cfg: LossConfig) -> dict[str, jax.Array]:
    """Accumulate gradients of sum(loss_sum) over micro-batches, divide by sum(denom), update."""
    graphdef, params = nnx.split(model)
    grad_fn = jax.value_and_grad(_loss, has_aux=True)

    def micro_step(carry, micro):
        grads, loss, denom, metrics = carry
        (l, (d, m)), g = grad_fn(params, graphdef, micro, cfg)
        grads = jax.tree.map(jnp.add, grads, g)
        return (grads, loss + l, denom + d, jax.tree.map(jnp.add, metrics, m)), None

    first = jax.tree.map(lambda x: x[0], batch)
    metric_shapes = jax.eval_shape(lambda: _loss(params, graphdef, first, cfg)[1][1])
    zeros = (
        jax.tree.map(jnp.zeros_like, params),
        jnp.float32(0),
        jnp.float32(0),
        jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), metric_shapes),
    )
    (grads, loss, denom, sums), _ = jax.lax.scan(micro_step, zeros, batch)
    denom = jnp.maximum(denom, 1e-8)
    grads = jax.tree.map(lambda g: g / denom, grads)
    optimizer.update(model, grads)
    tokens = jnp.maximum(sums.pop("tokens"), 1.0)
    out = {"loss": loss / denom, "grad_norm": optax.tree.norm(grads), "completion_tokens": tokens}
    out.update({k: v / tokens for k, v in sums.items()})
    return out


@functools.partial(nnx.jit, static_argnames=("temperature", "chunk"))
def sequence_logprobs_jit(model: Qwen3, seqs: Sequences, temperature: float, chunk: int,
                          prefix: Prefix | None = None) -> jax.Array:
    """[b, L] log-probs of the targets at loss_mask positions, 0 elsewhere (old or reference
    log-probs; no gradient)."""
    return sequence_logprobs(model, seqs, temperature=temperature, chunk=chunk, masked_only=True, prefix=prefix)[0]


def local_logprobs(model: Qwen3, mesh: jax.sharding.Mesh, seqs: Sequences, batch_size: int, n_micro: int,
                   temperature: float, chunk: int, prefix: Prefix | None = None) -> np.ndarray:
    """[b_local, L] log-probs of this process's rows `seqs` (those of `process_rows`) of a
    `batch_size`-row batch, computed one micro-batch at a time on global arrays (the training layout);
    `prefix`: their groups' shared prompt prefixes, as in `TrainBatch`."""
    sharding = NamedSharding(mesh, P((shd.DATA, shd.FSDP)))
    b = batch_size // n_micro
    mine = dist.local_rows(sharding, (b,), axis=0)

    def parts(tree, rows):
        local = jax.tree.map(lambda x: split_micro(np.asarray(x), n_micro), tree)
        return [jax.tree.map(lambda x: dist.global_array(x[m], sharding, (rows, *x.shape[2:])), local)
                for m in range(n_micro)]

    rows = parts(seqs, b)
    prefixes = [None] * n_micro if prefix is None else parts(prefix, b * len(prefix.tokens) // len(seqs.tokens))
    with shd.use_mesh(mesh):
        out = [dist.local_part(sequence_logprobs_jit(model, part, temperature, chunk, pre), mine)
               for part, pre in zip(rows, prefixes)]
    return np.concatenate(out)
