"""The typed config of a training run (`launch.train`): one frozen dataclass per concern.

Its defaults are the schema: configs/base.py is `config_tree(RunConfig)`, and experiment configs
override fields of it. A locked ml_collections config becomes a `RunConfig` through `typed`
(hljax/config.py): unknown keys, wrong types and bad values fail at start-up, naming the key.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import ml_collections

from hljax.config import FLAT, RUN_SANDBOX, ConfigError, DistributedSpec, ModelSpec, ServingSpec, SolverSpec, TaskSpec, typed
from hljax.generate.types import Sampling
from hljax.harness.prompts import PromptConfig
from hljax.loop.rewards import RewardConfig
from hljax.rl.states import StatesSpec
from hljax.mesh import MeshConfig
from hljax.metrics import check_backends
from hljax.rl.config import LossConfig, OptimConfig
from sandbox.config import SandboxConfig

# SFT takes larger steps than GRPO, with a warm-up and a shorter second-moment memory; the bare
# OptimConfig defaults are GRPO's (the `optim` block).
SFT_OPTIM = OptimConfig(learning_rate=1e-5, warmup_steps=10, b2=0.95)
# DAPO's clip-higher (eps_high 0.28 over eps_low 0.2) is the run default; the bare LossConfig keeps
# TRL's convention (eps_high None: the symmetric clip).
RUN_LOSS = LossConfig(eps_high=0.28)
# What the marker of every folder a training run writes whole names (hljax.checkpoint.owner): its
# initial weights, exports and weight syncs, which only a training run may replace.
WRITER = "launch.train"


@dataclasses.dataclass(frozen=True)
class SFTSpec:
    data: str = "data/sft_tiny.jsonl"  # JSONL rows of {messages, completion, harness, ...}.
    steps: int = 0  # SFT optimiser steps (0: no SFT stage).
    batch_size: int = 8  # Rows per optimiser step.
    micro_batches: int = 1  # Gradient accumulation: batch_size must divide into them.
    max_len: int = 1024  # Prompt + completion tokens; longer rows are an error naming the row.
    eval_rows: int = 8  # Rows held out to measure edit validity before and after SFT (0 skips).
    eval_max_new_tokens: int = 128  # Sampling budget of the validity measure.
    eval_temperature: float = 0.7  # Sampling temperature of the validity measure.


@dataclasses.dataclass(frozen=True)
class GRPOSpec:
    steps: int = 0  # GRPO steps (0: no GRPO stage).
    prompts_per_step: int = 2  # Revision states per step.
    group_size: int = 4  # G completions per state; advantages are relative within a group.
    micro_batches: int = 1  # Gradient accumulation over the step's rows.
    # Optimiser updates per batch of rollouts (TRL's num_iterations, the GRPO paper's mu), each on the
    # whole batch, old log-probs fixed across them. 1 (TRL's default, DeepSeekMath's runs): on-policy,
    # the ratio is 1 and the eps_low / eps_high clip never acts; from 2 on, later updates are
    # off-policy and the clip bounds them (clip_frac, policy_drift are means over the mu updates).
    mu: int = 1
    max_len: int = 2048  # Prompt + completion tokens a rollout may hold (bucketed); longer is an error.
    # Each group's prompt runs through the model once in the log-prob recompute and the train step, its
    # keys and values (Qwen3.5: and linear-attention state) shared by the group's G completions: the
    # same log-probs and gradients as rows that each carry the whole prompt (tests/test_shared_prompts.py)
    # for about 1/G of a long prompt's work (rows share by the part of a group one data-parallel device
    # holds: train_step.share_group). False: every row carries its whole prompt.
    share_prompts: bool = True
    # The proposals' sampling (its temperature is also that of the trained log-probs):
    sampling: Sampling = dataclasses.field(default=Sampling(), metadata={FLAT: True})
    scoring_questions: int = 4  # Per candidate; every candidate of a group gets the same ones.
    scoring_windows: int = 8  # Scoring questions rotate through this many disjoint windows.
    # Added to the global step that GRPO's draws (its states, scoring window and sampling seeds) come
    # from. GRPO alone (mode=grpo) from a run's export-sft, given that run's sft.steps, draws what the
    # run's GRPO drew: recipes compared from one SFT stage see the whole run's rollouts.
    draw_offset: int = 0
    # Feedback rounds (fresh report questions) per pool member: states = members x state_rounds distinct
    # prompts. Each costs one sandbox run of the harness on tasks.feedback questions (cached). Slots
    # walk through members, then rounds, so a state recurs every members x state_rounds slots; the
    # feedback split must hold state_rounds x tasks.feedback questions per task (tasks.pool_size).
    state_rounds: int = 4


@dataclasses.dataclass(frozen=True)
class RolloutSpec:
    # embedded_server: our JAX engine behind the SGLang HTTP API in this process, driven by the
    # SGLang client (the same code path as a real server). sglang: an external server at `url` (it must
    # have /update_weights_from_disk: SGLang, ours). sglang_jax: sglang-jax started by this process from
    # its venv (scripts/sglang_jax.sh setup) and restarted on each sync, as it loads no weights in place.
    # colocated: our engine in the trainer's process without HTTP, handed the new weights as arrays at
    # each sync (no export to disk; hljax/generate/colocated.py).
    backend: Literal["embedded_server", "colocated", "sglang", "sglang_jax"] = "embedded_server"
    url: str = ""  # SGLang server(s) or router of the proposer (backend sglang).
    sync_dir: str = ""  # Where new weights are exported for /update_weights_from_disk ("" = run_dir/sync; colocated: unused).
    # Embedded server (its dtype is the one it samples in; model.dtype the one the trainer scores in: a gap
    # between them shows in the sampler_logprob_gap metric):
    serving: ServingSpec = dataclasses.field(default=ServingSpec(), metadata={FLAT: True})


@dataclasses.dataclass(frozen=True)
class CheckpointSpec:
    every: int = 50  # Steps between checkpoints (the last step is always saved).
    keep: int = 3  # Checkpoints kept (oldest deleted).
    async_save: bool = True  # Write checkpoints in the background.


@dataclasses.dataclass(frozen=True)
class MetricsSpec:
    # Where each step's metrics row goes (hljax/metrics.py): "jsonl" (run_dir/metrics.jsonl, always on:
    # plots and resume read it), "tensorboard" (run_dir/tensorboard/; the viewer: pip install -e
    # '.[tb]'), "wandb" (Weights & Biases, off by default; pip install -e '.[wandb]').
    backends: tuple[str, ...] = ("jsonl", "tensorboard")
    wandb_project: str = "hljax"  # The W&B project of backend "wandb"; the run is named after run_dir.
    plots: bool = True  # Write curves.png at the end.

    def __post_init__(self):
        try:
            check_backends(self.backends, installed=False)  # Whether their packages are there: preflight.
        except ValueError as e:
            raise ConfigError(str(e)) from None


@dataclasses.dataclass(frozen=True)
class ExportSpec:
    at_end: bool = True  # Export the proposer as an HF folder (run_dir/export) at the end.
    dtype: str = ""  # "" = the initial checkpoint's dtype.
    after_sft: bool = False  # Also export the SFT proposer to run_dir/export-sft when GRPO starts.


@dataclasses.dataclass(frozen=True)
class RunConfig:
    mode: Literal["sft", "grpo", "sft+grpo"] = "sft+grpo"  # Stages to run, in order.
    run_dir: str = "runs/default"  # Checkpoints, metrics, plots, exports; rerunning on it resumes.
    seed: int = 0  # Everything a step consumes derives from (seed, step).
    model: ModelSpec = ModelSpec()
    mesh: MeshConfig = MeshConfig()
    distributed: DistributedSpec = DistributedSpec()
    optim: OptimConfig = OptimConfig()
    sft_optim: OptimConfig = SFT_OPTIM
    loss: LossConfig = RUN_LOSS
    sft: SFTSpec = SFTSpec()
    grpo: GRPOSpec = GRPOSpec()
    # Revision states GRPO trains on: seed (single-step), offline (phases, pool refreshed by the current
    # proposer), online (live revision chains); see hljax/rl/states.py.
    states: StatesSpec = StatesSpec()
    rollout: RolloutSpec = RolloutSpec()
    solver: SolverSpec = SolverSpec()
    tasks: TaskSpec = TaskSpec()
    sandbox: SandboxConfig = RUN_SANDBOX
    reward: RewardConfig = RewardConfig()
    prompt: PromptConfig = PromptConfig()
    checkpoint: CheckpointSpec = CheckpointSpec()
    metrics: MetricsSpec = MetricsSpec()
    export: ExportSpec = ExportSpec()

    def __post_init__(self):
        # The refresh samples as the training proposals do unless a config says otherwise (StatesSpec).
        refresh = self.states.refresh.following(self.grpo.sampling)
        object.__setattr__(self, "states", dataclasses.replace(self.states, refresh=refresh))
        if self.grpo.mu < 1:
            raise ConfigError(f"grpo.mu must be >= 1, got {self.grpo.mu}")
        for key, value in (("sft.steps", self.sft.steps), ("grpo.steps", self.grpo.steps),
                           ("grpo.draw_offset", self.grpo.draw_offset)):
            if value < 0:
                raise ConfigError(f"{key} must be >= 0, got {value}")
        need = []
        if not self.model.path and not self.model.preset:
            need.append("model.path (an HF Qwen3 folder)")
        if "grpo" in self.mode and self.rollout.backend == "sglang" and not self.rollout.url:
            need.append("rollout.url (the proposer's SGLang server)")
        if "grpo" in self.mode and self.solver.backend == "sglang" and not (self.solver.url and self.solver.path):
            need.append("solver.url and solver.path (the solver's server, and its HF folder for the chat template)")
        if "grpo" in self.mode and self.tasks.suite == "multihop_qa" and not self.tasks.qa_files:
            need.append("tasks.qa_files ('dataset:path' of the QA data)")
        if "sft" in self.mode and not self.sft.data:
            need.append("sft.data (the SFT JSONL)")
        if need:
            raise ConfigError("this config needs " + "; ".join(need))

    @property
    def sft_steps(self) -> int:
        return self.sft.steps if "sft" in self.mode else 0

    @property
    def grpo_steps(self) -> int:
        return self.grpo.steps if "grpo" in self.mode else 0

    @classmethod
    def from_config(cls, cfg: ml_collections.ConfigDict) -> RunConfig:
        d = cfg.to_dict()
        if "loss" in d:
            d["loss"] = {**d["loss"], "max_tokens": d["loss"].get("max_tokens") or None}  # 0 = none, as None.
        return typed(cls, d, "config")

