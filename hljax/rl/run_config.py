"""A locked ml_collections config -> one frozen, typed dataclass per concern.

Unknown keys, wrong types and bad values fail here, at start-up, naming the key.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Literal

import ml_collections

from hljax.generate.endpoints import GeneratorSpec
from hljax.generate.types import SamplingParams
from hljax.harness.prompts import PromptConfig
from hljax.loop.rewards import RewardConfig
from hljax.loop.states import StatesSpec
from hljax.rl.config import LossConfig, OptimConfig
from hljax.sharding import MeshConfig
from sandbox.config import SandboxConfig, SolverConfig


class ConfigError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    path: str = ""  # HF folder of the initial proposer; "" = random init from `preset`.
    preset: str = "tiny"  # launch.init_model preset used when path is "".
    dtype: Literal["float32", "bfloat16"] = "float32"  # Compute dtype.
    param_dtype: Literal["float32", "bfloat16"] = "float32"  # Storage dtype of trained weights.
    remat: bool = False  # Recompute layer activations in the backward pass (memory for compute).


@dataclasses.dataclass(frozen=True)
class DistributedSpec:
    initialize: bool = False  # Call jax.distributed.initialize(); with no fields set JAX auto-detects TPU/SLURM.
    coordinator: str = ""  # host:port of process 0 (else JAX_COORDINATOR_ADDRESS / auto-detect).
    num_processes: int = 0  # 0: JAX_NUM_PROCESSES / auto-detect.
    process_id: int = -1  # -1: JAX_PROCESS_ID / auto-detect.
    # A process silent this long is declared dead and the others fail with an error (not a hang).
    heartbeat_timeout_s: int = 100
    init_timeout_s: int = 300  # How long processes wait for each other at start-up.
    shutdown_timeout_s: int = 300  # How long a finished process waits for the others at exit.


@dataclasses.dataclass(frozen=True)
class SFTSpec:
    data: str = "data/sft_tiny.jsonl"  # JSONL rows of {messages, completion, harness, ...}.
    steps: int = 0
    batch_size: int = 8  # Rows per optimiser step.
    micro_batches: int = 1  # Gradient accumulation: batch_size must divide into them.
    max_len: int = 1024  # Prompt + completion tokens; longer rows are an error naming the row.
    eval_rows: int = 8  # Rows held out to measure edit validity before and after SFT (0 skips).
    eval_max_new_tokens: int = 128
    eval_temperature: float = 0.7


@dataclasses.dataclass(frozen=True)
class GRPOSpec:
    steps: int = 0
    prompts_per_step: int = 2  # Revision states per step.
    group_size: int = 4  # G completions per state; advantages are relative within a group.
    micro_batches: int = 1
    mu: int = 1  # Optimiser updates per batch of rollouts (old log-probs fixed across them).
    max_len: int = 2048
    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    scoring_questions: int = 4  # Per candidate; every candidate of a group gets the same ones.
    scoring_windows: int = 8  # Scoring questions rotate through this many disjoint windows.
    state_rounds: int = 4  # Feedback rounds (fresh report questions) per family in the state pool.


@dataclasses.dataclass(frozen=True)
class RolloutSpec:
    # embedded_server: our JAX engine behind the SGLang HTTP API in this process, driven by the
    # SGLang client (the same code path as a real server). sglang: an external server at `url`.
    backend: Literal["embedded_server", "sglang"] = "embedded_server"
    url: str = ""
    sync_dir: str = ""  # Where new weights are exported for /update_weights_from_disk ("" = run_dir/sync).
    max_batch: int = 16
    max_seq_len: int = 4096


@dataclasses.dataclass(frozen=True)
class SolverSpec:
    # embedded: in-process JAX engine (frozen). sglang: a server at `url`. simulated: the CPU stand-in
    # for an LLM (hljax/tasks/simulated_solver.py); it takes no path or url.
    backend: Literal["embedded", "sglang", "simulated"] = "embedded"
    path: str = ""  # HF folder of the solver; "" = the proposer's initial weights.
    url: str = ""
    max_batch: int = 16
    max_seq_len: int = 4096
    budget: SolverConfig = SolverConfig()

    def __post_init__(self):
        if self.backend == "simulated" and (self.path or self.url):
            raise ConfigError(f"solver.backend='simulated' is a stand-in for an LLM and loads no model, but "
                              f"solver.path={self.path!r} / solver.url={self.url!r} name one: set backend to "
                              "'embedded' or 'sglang' for a real model, or clear path and url")

    @property
    def simulated(self) -> bool:
        return self.backend == "simulated"

    def generator_spec(self, default_path: str, seed: int) -> GeneratorSpec:
        """How to open this solver; `default_path` serves an embedded solver when `path` is ""."""
        if self.backend == "simulated":
            return GeneratorSpec("simulated", seed=seed)
        if self.backend == "sglang":
            return GeneratorSpec("sglang", self.path, url=self.url)
        return GeneratorSpec("embedded", self.path or default_path, max_batch=self.max_batch,
                             max_seq_len=self.max_seq_len)


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    suite: Literal["reasoning_gym", "multihop_qa"] = "reasoning_gym"
    role: Literal["sft", "rl", "heldout"] = "rl"  # Which family list of hljax/tasks/rg_families.py.
    families: tuple[str, ...] = ()  # A subset of that list.
    qa_files: tuple[str, ...] = ()  # multihop_qa: "dataset:path" entries (hotpotqa, musique, 2wikimultihopqa).
    qa_aliases: str = ""  # 2WikiMultihopQA's id_aliases.json, if given.
    feedback: int = 4  # Questions per feedback round (the report).
    scoring: int = 64  # Size of the scoring split.
    eval: int = 64
    pool_size: int = 5000
    formats: tuple[str, ...] = ()  # Answer formats; () = all.


@dataclasses.dataclass(frozen=True)
class CheckpointSpec:
    every: int = 50
    keep: int = 3
    async_save: bool = True


@dataclasses.dataclass(frozen=True)
class LogSpec:
    tensorboard: bool = True
    plots: bool = True


@dataclasses.dataclass(frozen=True)
class ExportSpec:
    at_end: bool = True
    dtype: str = ""  # "" = the initial checkpoint's dtype.
    after_sft: bool = False  # Also export the SFT proposer to run_dir/export-sft when GRPO starts.


@dataclasses.dataclass(frozen=True)
class RunConfig:
    mode: Literal["sft", "grpo", "sft+grpo"]
    run_dir: str
    seed: int
    model: ModelSpec
    mesh: MeshConfig
    distributed: DistributedSpec
    optim: OptimConfig
    sft_optim: OptimConfig
    loss: LossConfig
    sft: SFTSpec
    grpo: GRPOSpec
    states: StatesSpec
    rollout: RolloutSpec
    solver: SolverSpec
    tasks: TaskSpec
    sandbox: SandboxConfig
    reward: RewardConfig
    prompt: PromptConfig
    checkpoint: CheckpointSpec
    log: LogSpec
    export: ExportSpec

    def __post_init__(self):
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
        d["solver"] = solver_fields(d.get("solver", {}))
        loss = dict(d.get("loss", {}))
        loss["max_tokens"] = loss.get("max_tokens") or None
        d["loss"] = loss
        return typed(cls, d, "config")


def solver_fields(solver: dict) -> dict:
    """A config's flat `solver` block -> SolverSpec fields, its budget and sampling keys nested."""
    solver = dict(solver)
    budget_keys = {"prompt_mode", "enable_thinking", "max_calls", "max_tokens"}
    sampling_keys = {"max_new_tokens", "temperature", "top_p", "top_k"}
    budget = {k: solver.pop(k) for k in list(solver) if k in budget_keys}
    sampling = {k: solver.pop(k) for k in list(solver) if k in sampling_keys}
    try:
        budget["sampling"] = SamplingParams(**sampling)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"solver: {e}") from None
    solver["budget"] = typed(SolverConfig, budget, "solver")
    return solver


def typed(cls, values: dict, where: str):
    """Build dataclass `cls` from `values`, recursing into nested dataclass fields."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(values) - set(fields)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}; valid keys: {sorted(fields)}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for name, value in values.items():
        hint = hints[name]
        if dataclasses.is_dataclass(hint) and isinstance(value, dict):
            value = typed(hint, value, f"{where}.{name}")
        elif typing.get_origin(hint) is tuple:
            if not isinstance(value, (list, tuple)):
                raise ConfigError(f"{where}.{name}={value!r} must be a tuple, e.g. ('a', 'b') (a string is not one)")
            value = tuple(value)
        elif typing.get_origin(hint) is Literal and value not in typing.get_args(hint):
            raise ConfigError(f"{where}.{name}={value!r} is not one of {typing.get_args(hint)}")
        kwargs[name] = value
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: {e}") from None
