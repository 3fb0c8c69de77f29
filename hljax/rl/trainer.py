"""The training loop: SFT then GRPO on the proposer, with checkpoints, resume, metrics and export.

Global step s runs SFT for s < sft.steps, then GRPO. Everything a step consumes derives from
(seed, s): the SFT batch, the revision states, the scoring window and the sampling seeds, so a run
resumed from a checkpoint at step k repeats what an uninterrupted run does from k + 1 on (and GRPO
alone from the run's export-sft with grpo.draw_offset = sft.steps repeats the run's GRPO).

Multi-process (one identical command per host, see docs/scaling.md): the mesh spans every process's
devices; each process loads, generates and scores only its rows of a step (`process_rows`, from the
batch sharding) and the step runs on global arrays. Per-row rollout statistics are gathered so
advantages and metrics are those of the whole batch. Checkpoints are written and read by all
processes together; metrics, plots, config and the export are written by process 0 alone.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import signal
import time

import jax
import jax.numpy as jnp
import numpy as np
import transformers
from flax import nnx
from tqdm.auto import tqdm

from hljax import distributed as dist
from hljax import metrics as mx
from hljax import sharding as shd
from hljax import xla_options
from hljax.checkpoint import hf, owner
from hljax.checkpoint.orbax import TrainCheckpointer
from hljax.checkpoint.presets import init_model
from hljax.config import check_rerun, save_config, to_json
from hljax.endpoints import solver_spec, to_generator_spec
from hljax.generate.engine import Engine, EngineConfig, Request
from hljax.generate.types import SamplingParams
from hljax.kernels import cpu_attention
from hljax.loop import rewards as rw
from hljax.loop.revision import candidate
from hljax.mesh import MeshConfig
from hljax.models.config import ModelConfig
from hljax.rl import sft_data
from hljax.rl.batching import (bucket_length, completion_logprobs, pack, pack_prefixes, place_completion_logprobs,
                               shared_prompts, split_micro)
from hljax.rl.config import LossConfig
from hljax.rl.logprobs import Prefix
from hljax.rl.rollout import COL, Rollouts, sample_rows, score_groups
from hljax.rl.run_config import WRITER, RunConfig
from hljax.seeding import derive_seed
from hljax.signals import StopSignals, Stopped
from hljax.tasks.simulated_solver import LABEL as SIMULATED_LABEL
from hljax.rl.train_step import (TrainBatch, global_batch, local_logprobs, make_optimizer, mean_metrics, process_rows,
                                 share_group, train_step)

log = logging.getLogger(__name__)
STATE_COL = COL["state"]


class Preempted(Stopped):
    """A stop signal arrived; the step it arrived in was checkpointed. `exit_code`: 128 + the signal."""


class Trainer:
    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        # Before any device is touched: the backend is created with the whole job's devices.
        self.multi = dist.initialize(cfg.distributed)
        os.makedirs(cfg.run_dir, exist_ok=True)
        if dist.is_main():
            # Before anything in run_dir is touched or a model loads (preflight checked it too, at start-up).
            path = os.path.join(cfg.run_dir, "config.json")
            changes = check_rerun(path, cfg, "train")
            if changes:
                log.info("%s: rerun with %s (allowed: they extend the run or change only where it runs)",
                         cfg.run_dir, "; ".join(map(str, changes)))
            save_config(path, cfg)
        self._check_exports()  # Every process, before a model loads: all stop together, in seconds.
        self.mesh = shd.make_mesh(cfg.mesh)
        # Where this process's own engines run: its devices only when there are several processes.
        self.local_mesh = dist.local_mesh(cfg.mesh) if self.multi else self.mesh
        self.init_path = self._initial_weights()
        xla_options.warn_if_remat_saves_nothing(cfg.model.remat)
        dtype = getattr(jnp, cfg.model.dtype)
        self.attention_kernel = cfg.model.attention_kernel != "off" and cpu_attention.resolve(
            cfg.model.attention_kernel, dtype, ModelConfig.from_pretrained(self.init_path).head_dim, self.mesh.size)
        self.model = hf.load_hf(self.init_path, self.mesh, dtype=dtype, param_dtype=getattr(jnp, cfg.model.param_dtype),
                                remat=cfg.model.remat, attention_kernel=self.attention_kernel)
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(self.init_path)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.stage = None
        self.optimizer = None
        self.checkpointer = TrainCheckpointer(os.path.join(cfg.run_dir, "checkpoints"), keep=cfg.checkpoint.keep,
                                              async_save=cfg.checkpoint.async_save)
        self._stop = False
        self._signals = StopSignals("checkpointing after the current step", announce=dist.is_main())
        self._saved = -1  # The last step checkpointed.
        self._row_extra: dict[str, float] = {}  # Figures measured between steps, for the next metrics row.
        self.rollouts: Rollouts | None = None  # Started at the first GRPO step.
        self.ref_model = None
        self._sft_data: tuple[list, list] | None = None  # (encoded training rows, held-out rows), loaded once.
        self._states_seen: set[int] = set()  # state_key of every revision state GRPO has trained on.

    # ----- set-up -----

    def _initial_weights(self) -> str:
        if self.cfg.model.path:
            return self.cfg.model.path
        path = os.path.join(self.cfg.run_dir, "init")
        if not os.path.exists(os.path.join(path, "config.json")):
            # Random init runs on the global mesh, a collective: every process takes part, process 0
            # keeps the folder (run_dir is shared, as orbax checkpoints need), the others discard theirs.
            out = path if dist.is_main() else f"{path}.discard-p{dist.process_index()}"
            # A discard folder left by a crash is this run's own: replaced.
            init_model(self.cfg.model.preset, out, seed=self.cfg.seed, writer=WRITER, replace=out != path)
            if out != path:
                shutil.rmtree(out)
            dist.barrier("init-weights")
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
        latest = self._resume()
        if latest is not None:
            start = latest + 1
            self._saved = latest
            log.info("resuming %s at step %d", cfg.run_dir, start)
        self.metrics = mx.MetricsWriter(cfg.run_dir, resume_from_step=start - 1 if latest is not None else -1,
                                        backends=cfg.metrics.backends, wandb_project=cfg.metrics.wandb_project,
                                        config=to_json(cfg), active=dist.is_main())
        # Every proposal with its reward and advantage; each process writes the rows it sampled.
        name = "rollouts.jsonl" if not self.multi else f"rollouts-p{dist.process_index()}.jsonl"
        self.rollout_log = os.path.join(cfg.run_dir, name)
        mx.truncate_jsonl(self.rollout_log, start - 1)
        # SIGTERM (a scheduler) and SIGINT (Ctrl-C) both checkpoint after the current step and exit.
        self._signals.__enter__()
        summary = {}
        try:
            if start == 0 and cfg.sft_steps and cfg.sft.eval_rows:
                # In step 0's metrics row (and so in TensorBoard), where the summary reads it back.
                self._row_extra["validity/before_sft"] = self._sft_validity("before")
            for stage, first, last in self._stages(start):
                if stage == "grpo" and first == cfg.sft_steps and cfg.sft_steps:  # SFT is done, GRPO starts.
                    self._after_sft()
                if stage == "grpo":
                    # Servers start here, while the optimiser is still the previous step's: a signal that
                    # ends their wait can checkpoint that step.
                    self._stoppable(first, lambda: self._open_rollouts(first))
                name = stage.upper()
                bar = tqdm(range(first, last), desc=name, initial=first - self._stage_start(stage),
                           total=last - self._stage_start(stage), unit="step", disable=not dist.is_main())
                for step in bar:
                    m = self._step(step, stage)
                    bar.set_postfix({k: f"{m[k]:.3g}" for k in ("loss", "reward/mean") if k in m})
                bar.close()
            self.checkpointer.wait()
            summary.update(headline(mx.read_jsonl(self.metrics.jsonl)) if dist.is_main() else {})
            summary["outputs"] = self._finish()
            if cfg.solver.simulated:
                summary["solver"] = SIMULATED_LABEL
        finally:
            self._signals.__exit__(None, None, None)
            self.metrics.close()
            if self.rollouts is not None:
                self.rollouts.close()
        return summary

    def _resume(self) -> int | None:
        """Restore the newest checkpoint that reads back whole; -> its step, or None for a new run.
        Newer steps that do not (a crash mid-write) are named in one warning each and set aside."""
        step, meta, damaged = self.checkpointer.newest_readable(self._restore)
        if damaged:
            dist.barrier("checkpoints-read")  # Nobody reads a step while it is moved.
            if dist.is_main():
                for bad, reason in damaged:
                    where = self.checkpointer.set_aside(bad)
                    log.warning("checkpoint step %d is damaged (%s): moved to %s; resuming from step %d, the "
                                "newest that restores", bad, reason, where, step)
            dist.barrier("damaged-checkpoints-set-aside")
            self.checkpointer.reload()
        if step is None:
            return None
        if meta.get("stage") != self.stage:  # The optimiser was reset at the stage boundary.
            raise RuntimeError(f"checkpoint stage {meta.get('stage')} does not match step {step}")
        self._states_seen = set(meta.get("states_seen", ()))
        return step

    def _restore(self, step: int) -> dict:
        """Load checkpoint `step` into the model and the optimiser of its stage; -> its meta."""
        self._make_optimizer(self._stage_of(step))
        return self.checkpointer.restore(self.model, self.optimizer, step)

    def _check_exports(self) -> None:
        """A folder where this run will export must be an earlier export of a run (hljax.checkpoint.owner):
        refused now, in seconds, rather than at the end of the run."""
        cfg = self.cfg
        names = ["export"] if cfg.export.at_end else []
        if cfg.sft_steps and cfg.grpo_steps and (cfg.export.after_sft or cfg.loss.beta > 0):
            names.append("export-sft")
        for name in names:
            owner.check_replaceable(os.path.join(cfg.run_dir, name), WRITER, replace=True, flag=None)

    def _stage_start(self, stage: str) -> int:
        return 0 if stage == "sft" else self.cfg.sft_steps

    def _stages(self, start: int) -> list[tuple[str, int, int]]:
        """(stage, first step, end) of each stage with steps left from `start`."""
        cfg = self.cfg
        spans = [("sft", 0, cfg.sft_steps), ("grpo", cfg.sft_steps, cfg.sft_steps + cfg.grpo_steps)]
        return [(stage, max(a, start), b) for stage, a, b in spans if b > max(a, start)]

    def _after_sft(self) -> None:
        cfg = self.cfg
        # The KL reference of a GRPO stage that follows SFT is the SFT proposer (loaded from here).
        if cfg.export.after_sft or cfg.loss.beta > 0:
            self._export("export-sft")

    def _step(self, step: int, stage: str) -> dict:
        """One step with its metrics row and checkpoint; raises Preempted once a stop signal arrived."""
        cfg = self.cfg
        total = cfg.sft_steps + cfg.grpo_steps
        self._make_optimizer(stage)
        m = self._stoppable(step, lambda: self._sft_step(step) if stage == "sft" else self._grpo_step(step))
        if stage == "sft" and step == cfg.sft_steps - 1 and cfg.sft.eval_rows:
            m["validity/after_sft"] = self._sft_validity("after")  # In the last SFT step's row.
        m.update(self._row_extra)
        self._row_extra = {}
        m["stage"] = stage
        if cfg.solver.simulated:
            m["solver"] = "simulated"  # Every row says its scores come from the stand-in solver.
        self.metrics.write(step, m)
        # A SIGTERM that reached any process stops all of them at the same step.
        self._stop = bool(dist.allgather(np.int32(self._signals.requested)).any())
        if (step + 1) % cfg.checkpoint.every == 0 or step == total - 1 or self._stop:
            t = time.perf_counter()
            self._save(step)
            # After this row is written (a crash must not leave a checkpoint without its row): in the next.
            self._row_extra["time/checkpoint_s"] = time.perf_counter() - t
        if self._stop:
            self.checkpointer.wait()
            raise Preempted(f"{self._signals.stopped(f'saved step {step}')}", self._signals.signum or signal.SIGTERM)
        return m

    def _stoppable(self, step: int, work):
        """`work()` for step `step`. A stop signal that ends a wait inside it (a server's start, a state
        refresh) comes before the step trains: step - 1 is checkpointed if it was not, and the run stops."""
        try:
            return work()
        except Stopped as e:
            if self._saved < step - 1 and self._stage_of(step - 1) == self.stage:
                self._save(step - 1)
            self.checkpointer.wait()
            saved = f"saved step {self._saved}" if self._saved >= 0 else "no step done yet"
            raise Preempted(f"{e} ({saved})", e.signum) from None

    def _save(self, step: int) -> None:
        self._saved = step
        self.checkpointer.save(step, self.model, self.optimizer, {"step": step, "stage": self.stage,
                                                                   "seed": self.cfg.seed,
                                                                   "states_seen": sorted(self._states_seen)})

    def _finish(self) -> dict:
        """Plots and the export; -> every output of the run by name (the summary lists those that exist)."""
        cfg = self.cfg
        run = cfg.run_dir
        plot = ""
        if cfg.metrics.plots and dist.is_main():
            title = os.path.basename(run.rstrip("/"))
            if cfg.solver.simulated:
                title += " (simulated solver: a stand-in for an LLM)"
            plot = mx.plot_curves(mx.read_jsonl(self.metrics.jsonl), os.path.join(run, "curves.png"), title=title) or ""
        export = self._export("export") if cfg.export.at_end else ""
        return {"run_dir": run, "config": os.path.join(run, "config.json"), "metrics": self.metrics.jsonl,
                "rollouts": self.rollout_log, "tensorboard": self.metrics.tensorboard or "", "plot": plot,
                "checkpoints": os.path.join(run, "checkpoints"), "export_sft": os.path.join(run, "export-sft"),
                "export": export}

    def _export(self, name: str) -> str:
        """The current proposer as an HF folder run_dir/`name` (collective when multi-process)."""
        host = self._host_model()  # Everyone gathers, process 0 writes.
        path = os.path.join(self.cfg.run_dir, name)
        if dist.is_main():
            hf.save_hf(host, path, dtype=self.cfg.export.dtype or None, source_dir=self.init_path, writer=WRITER,
                       replace=True)
        return path

    # ----- SFT -----

    def _sft_rows(self):
        if self._sft_data is None:
            rows = sft_data.load_rows(self.cfg.sft.data)
            n_eval = min(self.cfg.sft.eval_rows, len(rows) // 4)
            think = self.cfg.model.enable_thinking
            self._sft_data = ([sft_data.encode(self.tokenizer, r, think) for r in rows[n_eval:]], rows[:n_eval])
        return self._sft_data

    def _sft_step(self, step: int) -> dict:
        cfg = self.cfg
        train, _ = self._sft_rows()
        rows = process_rows(self.mesh, cfg.sft.batch_size, cfg.sft.micro_batches)
        seqs = sft_data.batches(train, cfg.sft.batch_size, cfg.sft.max_len, cfg.seed, step, self.pad_id, rows=rows)
        zeros = np.zeros(seqs.tokens.shape, np.float32)
        batch = self._micro(seqs, np.zeros(len(seqs.tokens), np.float32), zeros, zeros, zeros, cfg.sft.micro_batches)
        loss_cfg = dataclasses.replace(cfg.loss, mode="sft", temperature=1.0)
        t = time.perf_counter()
        m = self._train(batch, loss_cfg, cfg.sft.batch_size)
        m["time/train_s"] = time.perf_counter() - t
        tokens = dist.allgather(seqs.attention_mask.sum()).sum()
        m["tokens_per_s"] = float(tokens) / m["time/train_s"]
        return m

    def _sft_validity(self, when: str) -> float:
        """Share of held-out SFT prompts whose sampled completion is a valid edit of the row's harness.
        Each process samples its block of the rows on its own devices; the counts are summed."""
        cfg = self.cfg
        _, rows = self._sft_rows()
        if self.multi:
            copy = dist.local_copy(self.model, self.local_mesh)
        else:
            copy = nnx.merge(*nnx.split(jax.tree.map(jnp.copy, self.model)))  # The engine must not see donated buffers.
        mine = np.array_split(np.arange(len(rows)), dist.process_count())[dist.process_index()]
        valid = 0
        if len(mine):
            engine = Engine(copy, self.local_mesh, EngineConfig(max_batch=len(mine), max_seq_len=cfg.sft.max_len + 256),
                            self.tokenizer)
            requests = [Request(tuple(sft_data.encode(self.tokenizer, rows[i], cfg.model.enable_thinking)[0]),
                                SamplingParams(max_new_tokens=cfg.sft.eval_max_new_tokens,
                                               temperature=cfg.sft.eval_temperature, seed=derive_seed(cfg.seed, int(i))))
                        for i in mine]
            outs = engine.generate(requests)
            valid = sum(rw.failure_kind(candidate(rows[i].harness, o.text)) is None for i, o in zip(mine, outs))
        rate = float(dist.allgather(np.int64(valid)).sum() / len(rows))
        if dist.is_main():
            print(f"edit validity on {len(rows)} held-out SFT prompts {when} SFT: {rate:.2f}", flush=True)
        return rate

    # ----- GRPO -----

    def _open_rollouts(self, step: int) -> None:
        """The proposer and solver endpoints, the sandbox and the state pool, once, before GRPO step `step`."""
        cfg = self.cfg
        if self.rollouts is not None:
            return
        self.rollouts = Rollouts(
            to_generator_spec(cfg.rollout.backend, url=cfg.rollout.url, serving=cfg.rollout.serving,
                              default_path=self.init_path),
            solver_spec(cfg.solver, self.init_path, cfg.seed), cfg.solver.budget, grpo=cfg.grpo,
            states=cfg.states, tasks=cfg.tasks, sandbox=cfg.sandbox, reward=cfg.reward, prompt=cfg.prompt,
            seed=cfg.seed, first_step=cfg.sft_steps, sync_dtype=cfg.model.param_dtype,
            sync_dir=cfg.rollout.sync_dir or os.path.join(cfg.run_dir, "sync"),
            states_dir=os.path.join(cfg.run_dir, "states"), tokenizer=self.tokenizer, mesh=self.local_mesh,
            enable_thinking=cfg.model.enable_thinking)
        self.rollouts.sync(self._host_model(), version=str(step))  # Resumed or post-SFT weights.
        if cfg.loss.beta > 0:
            self.ref_model = hf.load_hf(self._reference_path(), self.mesh, dtype=getattr(jnp, cfg.model.dtype),
                                        attention_kernel=self.attention_kernel)

    def _grpo_step(self, step: int) -> dict:
        cfg, g = self.cfg, self.cfg.grpo
        self._open_rollouts(step)
        B = g.prompts_per_step * g.group_size
        rows = process_rows(self.mesh, B, g.micro_batches)
        slots = _slots(rows, g.group_size)
        t0 = time.perf_counter()
        batch = self.rollouts.collect(step, slots)
        t1 = time.perf_counter()
        # Advantages and metrics from the statistics of every row of the step, in step order.
        stats = dist.gather_rows(rows, batch.stats, B)
        advantages, keep, metrics = score_groups(stats, g.group_size, cfg.loss)
        self._states_seen.update(int(k) for k in stats[:, STATE_COL])
        metrics["states/distinct"] = len(self._states_seen)  # Over the run so far (kept in checkpoints).
        adv = np.where(keep[rows], advantages[rows], 0.0).astype(np.float32)
        mx.append_jsonl(self.rollout_log, sample_rows(step, rows, batch, advantages, keep))

        prompts = [p for p, _ in batch.sequences]
        completions = [c for _, c in batch.sequences]
        # Every process packs to the same lengths: those of the longest rows of the whole step.
        longest = lambda n: int(dist.allgather(n).max())  # noqa: E731
        whole = bucket_length(longest(max(len(p) + len(c) for p, c in batch.sequences)))
        if whole > g.max_len:
            raise ValueError(f"a rollout has {whole} tokens (bucketed), over grpo.max_len={g.max_len}")
        prefix = None
        if g.share_prompts:  # Rows hold their prompt's last token and completion; the rest is shared.
            prefixes, prompts = shared_prompts(prompts, share_group(self.mesh, B, g.micro_batches, g.group_size))
            prefix = Prefix(*pack_prefixes(prefixes, bucket_length(longest(max(map(len, prefixes)))), self.pad_id))
        length = bucket_length(longest(max(len(p) + len(c) for p, c in zip(prompts, completions))))
        seqs = pack(prompts, completions, length, self.pad_id)
        old = self._logprobs(self.model, seqs, g.sampling.temperature, B, prefix)
        ref = (self._logprobs(self.ref_model, seqs, g.sampling.temperature, B, prefix) if cfg.loss.beta > 0
               else np.zeros_like(old))
        gap_sum, gap_n = dist.allgather(_sampler_gap(old, batch.sampler_logprobs, prompts)).sum(axis=0)
        # The sampler's log-probs where the truncated importance weight reads them; else unused.
        sampler = old if not cfg.loss.tis_cap else place_completion_logprobs(
            batch.sampler_logprobs, [len(p) for p in prompts], [len(c) for c in completions], old)
        seqs = dataclasses.replace(seqs, loss_mask=seqs.loss_mask * keep[rows][:, None].astype(np.float32))
        train_batch = self._micro(seqs, adv, old, ref, sampler, g.micro_batches, prefix)
        loss_cfg = dataclasses.replace(cfg.loss, mode="grpo", temperature=g.sampling.temperature)
        t2 = time.perf_counter()
        # grpo.mu updates on this one batch; `old` (the policy before the first) stays their reference.
        m = mean_metrics([self._train(train_batch, loss_cfg, B) for _ in range(g.mu)])
        t3 = time.perf_counter()
        self.rollouts.sync(self._host_model(), version=str(step + 1))
        t4 = time.perf_counter()
        # The rows' whole prompt + completion tokens, however they were laid out.
        tokens = dist.allgather(sum(len(p) + len(c) for p, c in batch.sequences)).sum()
        m.update(metrics)
        m.update({
            "sampler_logprob_gap": float(gap_sum / gap_n) if gap_n else float("nan"),
            "time/generate_s": batch.time_generate,
            "time/sandbox_s": batch.time_sandbox,
            "time/logprobs_s": t2 - t1,  # Gathering the step's rows, packing, old and reference log-probs.
            "time/train_s": t3 - t2,
            "time/sync_s": t4 - t3,
            "tokens_per_s": float(tokens * g.mu) / (t3 - t2),
            "time/step_s": t4 - t0,
            "time/collect_s": t1 - t0,
        })
        return m

    def _reference_path(self) -> str:
        """The frozen KL reference: the policy GRPO started from (the SFT proposer after an SFT stage)."""
        if not self.cfg.sft_steps:
            return self.init_path
        path = os.path.join(self.cfg.run_dir, "export-sft")
        if not os.path.exists(os.path.join(path, "config.json")):
            raise FileNotFoundError(f"loss.beta > 0 needs the SFT proposer as KL reference, written to {path} when "
                                    "GRPO started; it is missing (deleted?), so this run cannot resume with a KL term")
        return path

    def _logprobs(self, model, seqs, temperature, batch_size: int, prefix=None) -> np.ndarray:
        return local_logprobs(model, self.mesh, seqs, batch_size, self.cfg.grpo.micro_batches, temperature,
                              self.cfg.loss.logprob_chunk, prefix)

    def _host_model(self):
        """The model with every parameter addressable by this process: itself for one process, else a
        gathered copy on this process's first CPU device (collective: all processes call it)."""
        if not self.multi:
            return self.model
        return dist.local_copy(self.model, shd.make_mesh(MeshConfig(1, 1, 1), jax.local_devices(backend="cpu")[:1]))

    # ----- shared -----

    def _micro(self, seqs, adv, old, ref, sampler, n_micro, prefix=None) -> TrainBatch:
        m = lambda x: split_micro(np.asarray(x), n_micro)  # noqa: E731
        return TrainBatch(seqs=jax.tree.map(m, seqs), advantages=m(adv), old_logp=m(old), ref_logp=m(ref),
                          sampler_logp=m(sampler), prefix=None if prefix is None else jax.tree.map(m, prefix))

    def _train(self, batch: TrainBatch, loss_cfg: LossConfig, batch_size: int) -> dict:
        """One step on this process's rows `batch` ([M, b_local, ...]) of a `batch_size`-row batch."""
        with shd.use_mesh(self.mesh):
            out = train_step(self.model, self.optimizer, global_batch(batch, self.mesh, batch_size), loss_cfg)
        return {k: float(v) for k, v in jax.device_get(out).items()}


def _slots(rows: np.ndarray, group_size: int) -> list[int]:
    """This process's rows -> the states (slots) whose groups they are. A process must hold whole
    groups, in order: its rollouts are generated and scored where they are trained."""
    slots = list(dict.fromkeys(int(r) // group_size for r in rows))
    if list(rows) != [s * group_size + j for s in slots for j in range(group_size)]:
        raise ValueError(
            f"process {dist.process_index()} holds rows {list(rows)} of the GRPO batch, not whole groups of "
            f"group_size={group_size}: make prompts_per_step * group_size / (micro_batches * processes) a "
            "multiple of group_size")
    return slots


def _sampler_gap(trainer_lp: np.ndarray, sampler_lps, prompts) -> np.ndarray:
    """[sum, count] of |sampler - trainer| log-prob over completion tokens (engines differ in numerics)."""
    gaps = [np.abs(completion_logprobs(trainer_lp[b], len(p), len(lps)) - np.asarray(lps))
            for b, (lps, p) in enumerate(zip(sampler_lps, prompts)) if lps]
    flat = np.concatenate(gaps) if gaps else np.zeros(0)
    return np.array([flat.sum(), flat.size], np.float64)



# A GRPO step's phases, as `time/<phase>_s` in its metrics row (collect = generate + sandbox + state prep).
PHASES = ("generate", "sandbox", "logprobs", "train", "sync", "checkpoint")


def headline(rows: list[dict]) -> dict[str, str]:
    """The figures a finished run leads with, read from its metrics rows (so a rerun shows them too):
    edit validity before and after SFT, and the GRPO candidates' `score/mean`, first quarter of the
    GRPO steps against the last (the figure the README's quick start quotes)."""
    out = {}
    for key in ("validity/before_sft", "validity/after_sft"):
        values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
        if values:
            out[f"edit validity {key.split('/')[1].replace('_', ' ')}"] = f"{values[-1]:.2f}"
    grpo = [r for r in rows if r.get("stage") == "grpo"]
    if grpo:  # Where the GRPO steps' time went (sum over steps; the checkpoint's blocking part only).
        parts = [(name, sum(r.get(f"time/{name}_s", 0.0) for r in grpo)) for name in PHASES]
        total = sum(r.get("time/step_s", 0.0) for r in grpo) + dict(parts)["checkpoint"]
        parts.append(("other", max(0.0, total - sum(secs for _, secs in parts))))
        out["GRPO time"] = f"{total / 60:.1f} min over {len(grpo)} steps: " + ", ".join(
            f"{name} {secs / max(total, 1e-9):.0%}" for name, secs in parts if secs > 0)
    quarters = mx.grpo_score_quarters(rows, min_steps=4)
    if quarters:
        first, last, q = quarters
        out["GRPO score/mean"] = (f"{first:.3f} (first {q} steps) -> {last:.3f} (last {q}), scoring-set score of "
                                  "the sampled candidates")
    return out
