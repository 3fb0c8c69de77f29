"""The training loop: SFT then GRPO on the proposer, with checkpoints, resume, metrics and export.

Global step s runs SFT for s < sft.steps, then GRPO. Everything a step consumes derives from
(seed, s): the SFT batch, the revision states, the scoring window and the sampling seeds, so a run
resumed from a checkpoint at step k repeats what an uninterrupted run does from k + 1 on.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import time

import jax
import jax.numpy as jnp
import numpy as np
import transformers
from flax import nnx
from tqdm.auto import tqdm

from hljax import metrics as mx
from hljax import sharding as shd
from hljax.checkpoint import hf
from hljax.checkpoint.orbax import TrainCheckpointer
from hljax.generate.engine import Engine, EngineConfig, Request
from hljax.generate.types import SamplingParams
from hljax.loop.revision import candidate
from hljax.models.presets import init_model
from hljax.rl import rewards as rw
from hljax.rl import sft_data
from hljax.rl.batching import bucket_length, completion_logprobs, pack, split_micro
from hljax.rl.config import LossConfig
from hljax.rl.rollout import Rollouts, derive_seed
from hljax.rl.run_config import RunConfig
from hljax.rl.train_step import TrainBatch, batch_sharding, make_optimizer, sequence_logprobs_jit, train_step

log = logging.getLogger(__name__)


class Preempted(Exception):
    pass


class Trainer:
    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        os.makedirs(cfg.run_dir, exist_ok=True)
        if cfg.distributed.initialize:
            kw = {k: v for k, v in (("coordinator_address", cfg.distributed.coordinator),
                                    ("num_processes", cfg.distributed.num_processes),
                                    ("process_id", cfg.distributed.process_id)) if v not in ("", 0, -1)}
            jax.distributed.initialize(**kw)
        self.mesh = shd.make_mesh(cfg.mesh)
        self.init_path = self._initial_weights()
        dtype = getattr(jnp, cfg.model.dtype)
        self.model = hf.load_hf(self.init_path, self.mesh, dtype=dtype, param_dtype=getattr(jnp, cfg.model.param_dtype),
                                remat=cfg.model.remat)
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(self.init_path)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.stage = None
        self.optimizer = None
        self.checkpointer = TrainCheckpointer(os.path.join(cfg.run_dir, "checkpoints"), keep=cfg.checkpoint.keep,
                                              async_save=cfg.checkpoint.async_save)
        self._stop = False
        self.rollouts: Rollouts | None = None  # Started at the first GRPO step.
        self.ref_model = None
        self._sft_data: tuple[list, list] | None = None  # (encoded training rows, held-out rows), loaded once.

    # ----- set-up -----

    def _initial_weights(self) -> str:
        if self.cfg.model.path:
            return self.cfg.model.path
        path = os.path.join(self.cfg.run_dir, "init")
        if not os.path.exists(os.path.join(path, "config.json")):
            init_model(self.cfg.model.preset, path, seed=self.cfg.seed)
        return path

    def _make_optimizer(self, stage: str) -> None:
        if self.stage == stage:
            return
        ocfg = self.cfg.sft_optim if stage == "sft" else self.cfg.optim
        with shd.use_mesh(self.mesh):
            self.optimizer = nnx.Optimizer(self.model, make_optimizer(ocfg), wrt=nnx.Param)
        self.stage = stage

    def _stage_of(self, step: int) -> str:
        return "sft" if step < self.cfg.sft_steps else "grpo"

    # ----- main loop -----

    def run(self) -> dict:
        cfg = self.cfg
        total = cfg.sft_steps + cfg.grpo_steps
        if total == 0:
            raise ValueError(f"nothing to do: mode={cfg.mode!r} with sft.steps={cfg.sft.steps}, "
                             f"grpo.steps={cfg.grpo.steps}")
        start = 0
        latest = self.checkpointer.latest_step()
        if latest is not None:
            self._make_optimizer(self._stage_of(latest))
            meta = self.checkpointer.restore(self.model, self.optimizer)
            if meta.get("stage") != self.stage:  # The optimiser was reset at the stage boundary.
                raise RuntimeError(f"checkpoint stage {meta.get('stage')} does not match step {latest}")
            start = latest + 1
            log.info("resuming %s at step %d", cfg.run_dir, start)
        self.metrics = mx.MetricsWriter(cfg.run_dir, resume_from_step=start - 1 if latest is not None else -1,
                                        tensorboard=cfg.log.tensorboard)
        with open(os.path.join(cfg.run_dir, "config.json"), "w") as f:
            json.dump(_jsonable(dataclasses.asdict(cfg)), f, indent=2)
        previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        summary = {}
        try:
            if start < cfg.sft_steps and cfg.sft.eval_rows:
                summary["validity_before_sft"] = self._sft_validity("before")
            bar = tqdm(range(start, total), desc="train", initial=start, total=total)
            for step in bar:
                stage = self._stage_of(step)
                if stage == "grpo" and step == cfg.sft_steps and cfg.sft_steps and cfg.sft.eval_rows:
                    summary["validity_after_sft"] = self._sft_validity("after")
                self._make_optimizer(stage)
                m = self._sft_step(step) if stage == "sft" else self._grpo_step(step)
                m["stage"] = stage
                self.metrics.write(step, m)
                bar.set_postfix({k: f"{m[k]:.3g}" for k in ("loss", "reward/mean") if k in m})
                last = step == total - 1
                if (step + 1) % cfg.checkpoint.every == 0 or last or self._stop:
                    self._save(step)
                if self._stop:
                    self.checkpointer.wait()
                    raise Preempted(f"SIGTERM: saved step {step}; rerun the same command to resume")
            if cfg.sft_steps and not cfg.grpo_steps and cfg.sft.eval_rows and "validity_after_sft" not in summary:
                summary["validity_after_sft"] = self._sft_validity("after")
            self.checkpointer.wait()
            summary.update(self._finish())
        finally:
            signal.signal(signal.SIGTERM, previous)
            self.metrics.close()
            if self.rollouts is not None:
                self.rollouts.close()
        return summary

    def _on_sigterm(self, signum, frame):
        log.warning("SIGTERM received: checkpointing after the current step")
        self._stop = True

    def _save(self, step: int) -> None:
        self.checkpointer.save(step, self.model, self.optimizer, {"step": step, "stage": self.stage,
                                                                   "seed": self.cfg.seed})

    def _finish(self) -> dict:
        cfg = self.cfg
        out = {"run_dir": cfg.run_dir, "metrics": self.metrics.jsonl}
        if cfg.log.plots:
            png = mx.plot_curves(mx.read_jsonl(self.metrics.jsonl), os.path.join(cfg.run_dir, "curves.png"),
                                 title=os.path.basename(cfg.run_dir.rstrip("/")))
            if png:
                out["plot"] = png
        if cfg.export.at_end and jax.process_index() == 0:
            out["export"] = hf.save_hf(self.model, os.path.join(cfg.run_dir, "export"), dtype=cfg.export.dtype or None,
                                       source_dir=self.init_path)
        out["checkpoints"] = self.checkpointer.directory
        return out

    # ----- SFT -----

    def _sft_rows(self):
        if self._sft_data is None:
            rows = sft_data.load_rows(self.cfg.sft.data)
            n_eval = min(self.cfg.sft.eval_rows, len(rows) // 4)
            self._sft_data = ([sft_data.encode(self.tokenizer, r) for r in rows[n_eval:]], rows[:n_eval])
        return self._sft_data

    def _sft_step(self, step: int) -> dict:
        cfg = self.cfg
        train, _ = self._sft_rows()
        seqs = sft_data.batches(train, cfg.sft.batch_size, cfg.sft.max_len, cfg.seed, step, self.pad_id)
        zeros = np.zeros(seqs.tokens.shape, np.float32)
        batch = self._micro(seqs, np.zeros(len(seqs.tokens), np.float32), zeros, zeros, cfg.sft.micro_batches)
        loss_cfg = dataclasses.replace(cfg.loss, mode="sft", temperature=1.0)
        t = time.perf_counter()
        m = self._train(batch, loss_cfg)
        m["time/train_s"] = time.perf_counter() - t
        m["tokens_per_s"] = float(seqs.attention_mask.sum()) / m["time/train_s"]
        return m

    def _sft_validity(self, when: str) -> float:
        """Share of held-out SFT prompts whose sampled completion is a valid edit of the row's harness."""
        cfg = self.cfg
        _, rows = self._sft_rows()
        copy = nnx.merge(*nnx.split(jax.tree.map(jnp.copy, self.model)))  # The engine must not see donated buffers.
        engine = Engine(copy, self.mesh, EngineConfig(max_batch=len(rows), max_seq_len=cfg.sft.max_len + 256),
                        self.tokenizer)
        requests = [Request(tuple(sft_data.encode(self.tokenizer, r)[0]),
                            SamplingParams(max_new_tokens=cfg.sft.eval_max_new_tokens,
                                           temperature=cfg.sft.eval_temperature, seed=derive_seed(cfg.seed, i)))
                    for i, r in enumerate(rows)]
        outs = engine.generate(requests)
        valid = [rw.failure_kind(candidate(r.harness, o.text)) is None for r, o in zip(rows, outs)]
        rate = float(np.mean(valid))
        print(f"edit validity on {len(rows)} held-out SFT prompts {when} SFT: {rate:.2f}", flush=True)
        return rate

    # ----- GRPO -----

    def _grpo_step(self, step: int) -> dict:
        cfg, g = self.cfg, self.cfg.grpo
        if self.rollouts is None:
            self.rollouts = Rollouts(cfg, self.init_path, self.tokenizer, self.mesh)
            self.rollouts.sync(self.model, version=str(step))  # Resumed or post-SFT weights.
            if cfg.loss.beta > 0:
                self.ref_model = hf.load_hf(self.init_path, self.mesh, dtype=getattr(jnp, cfg.model.dtype))
        t0 = time.perf_counter()
        batch = self.rollouts.collect(step)
        t1 = time.perf_counter()
        seqs_prompts = [p for p, _ in batch.sequences]
        seqs_completions = [c for _, c in batch.sequences]
        length = bucket_length(max(len(p) + len(c) for p, c in batch.sequences))
        if length > g.max_len:
            raise ValueError(f"a rollout has {length} tokens (bucketed), over grpo.max_len={g.max_len}")
        seqs = pack(seqs_prompts, seqs_completions, length, self.pad_id)
        old = self._logprobs(self.model, seqs, g.temperature)
        ref = self._logprobs(self.ref_model, seqs, g.temperature) if cfg.loss.beta > 0 else np.zeros_like(old)
        gap = _sampler_gap(old, batch.sampler_logprobs, seqs_prompts)
        adv = np.where(batch.keep, batch.advantages, 0.0).astype(np.float32)
        seqs = dataclasses.replace(seqs, loss_mask=seqs.loss_mask * batch.keep[:, None].astype(np.float32))
        train_batch = self._micro(seqs, adv, old, ref, g.micro_batches)
        loss_cfg = dataclasses.replace(cfg.loss, mode="grpo", temperature=g.temperature)
        t2 = time.perf_counter()
        for _ in range(g.mu):
            m = self._train(train_batch, loss_cfg)
        t3 = time.perf_counter()
        self.rollouts.sync(self.model, version=str(step + 1))
        t4 = time.perf_counter()
        m.update(batch.metrics)
        m.update({
            "sampler_logprob_gap": gap,
            "time/generate_s": batch.time_generate,
            "time/sandbox_s": batch.time_sandbox,
            "time/train_s": t3 - t2,
            "time/sync_s": t4 - t3,
            "tokens_per_s": float(seqs.attention_mask.sum() * g.mu) / (t3 - t2),
            "time/step_s": t4 - t0,
            "time/collect_s": t1 - t0,
        })
        return m

    def _logprobs(self, model, seqs, temperature) -> np.ndarray:
        mb = max(1, len(seqs.tokens) // max(1, self.cfg.grpo.micro_batches))
        out = []
        with shd.use_mesh(self.mesh):
            for i in range(0, len(seqs.tokens), mb):
                part = jax.tree.map(lambda x: jnp.asarray(x[i : i + mb]), seqs)
                out.append(np.asarray(sequence_logprobs_jit(model, part, temperature, self.cfg.loss.logprob_chunk)))
        return np.concatenate(out)

    # ----- shared -----

    def _micro(self, seqs, adv, old, ref, n_micro) -> TrainBatch:
        m = lambda x: split_micro(np.asarray(x), n_micro)  # noqa: E731
        return TrainBatch(seqs=jax.tree.map(m, seqs), advantages=m(adv), old_logp=m(old), ref_logp=m(ref))

    def _train(self, batch: TrainBatch, loss_cfg: LossConfig) -> dict:
        with shd.use_mesh(self.mesh):
            batch = jax.device_put(batch, batch_sharding(self.mesh))
            out = train_step(self.model, self.optimizer, batch, loss_cfg)
        return {k: float(v) for k, v in jax.device_get(out).items()}


def _sampler_gap(trainer_lp: np.ndarray, sampler_lps, prompts) -> float:
    """Mean |sampler - trainer| log-prob over completion tokens (engines differ in numerics)."""
    gaps = [np.abs(completion_logprobs(trainer_lp[b], len(p), len(lps)) - np.asarray(lps))
            for b, (lps, p) in enumerate(zip(sampler_lps, prompts)) if lps]
    return float(np.concatenate(gaps).mean()) if gaps else float("nan")


def _jsonable(x):
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return str(x)
