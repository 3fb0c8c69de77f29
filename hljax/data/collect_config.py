"""The typed config of a collection run (`launch.collect`, hljax/data/collect.py).

Its defaults are the schema: configs/collect_base.py is `config_tree(CollectConfig)`, and
configs/collect_rg.py (the paper's Reasoning Gym collection) applies the Reasoning Gym setup
(configs/setups.py), the solver and revision conditions training and evaluation use too. Built from a
locked ml_collections config by `typed` (hljax/config.py): unknown keys, wrong types and bad values
fail at start-up, naming the key.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import ml_collections

from hljax.config import FLAT, RUN_SOLVER_BUDGET, ConfigError, ServingSpec, SolverSpec, TaskSpec, typed
from hljax.generate.types import Sampling
from hljax.harness.filters import FilterConfig
from hljax.harness.prompts import PromptConfig
from hljax.mesh import MeshConfig
from sandbox.config import SandboxConfig, SolverConfig


@dataclasses.dataclass(frozen=True)
class TeacherSpec:
    """The model that proposes revisions, and how it is sampled."""

    # embedded_server: our JAX engine on `path` (or a random `preset` model) behind the HTTP API in
    # this process, spoken to through `api` as any server would be. remote: a running server at `url`.
    backend: Literal["embedded_server", "remote"] = "remote"
    # openai: /v1/chat/completions (OpenAI, vLLM, SGLang; the server applies the chat template).
    # sglang: SGLang's native /generate, the chat template rendered here from `path`'s tokenizer.
    api: Literal["openai", "sglang"] = "openai"
    url: str = ""  # The teacher's OpenAI/SGLang-compatible server.
    model: str = ""  # The openai request's "model" field; "" = the base name of `path`.
    path: str = ""  # HF folder: the embedded weights, or the tokenizer for api="sglang".
    preset: str = "tiny"  # embedded_server with no path: a random model of this preset (tests, smoke runs).
    api_key_env: str = ""  # Name of the environment variable holding an API key ("" = none).
    template_kwargs: bool = True  # Send chat_template_kwargs (SGLang/vLLM); off for api.openai.com.
    # Qwen3's thinking mode in the teacher's chat template (chat_template_kwargs). False: the kept
    # completions are edits with no reasoning before them, what the proposer is trained to write.
    enable_thinking: bool = False
    # The teacher's sampling:
    sampling: Sampling = dataclasses.field(default=Sampling(max_new_tokens=4096, temperature=0.7, top_p=0.95),
                                           metadata={FLAT: True})
    timeout_s: float = 900.0  # Per HTTP request.
    # embedded_server:
    serving: ServingSpec = dataclasses.field(default=ServingSpec(max_seq_len=16384), metadata={FLAT: True})


# A collection's default solver: an SGLang server with greedy answers, a bigger budget than a training
# run's default. The paper's collection (configs/collect_rg.py) replaces it with its setup's.
COLLECT_SOLVER = SolverSpec(backend="sglang", serving=ServingSpec(max_batch=64, max_seq_len=8192), budget=SolverConfig(
    sampling=dataclasses.replace(RUN_SOLVER_BUDGET.sampling, max_new_tokens=1024), max_calls=8, max_tokens=8192))


@dataclasses.dataclass(frozen=True)
class CollectConfig:
    out: str = "data/teacher.jsonl"  # JSONL of kept rows.
    run_dir: str = "runs/collect"  # Scratch: the random teacher model of an embedded preset.
    seed: int = 0  # Questions and sampling derive from it.
    rounds: int = 4  # Revision states (feedback rounds) per task: 21 SFT families x 4 = 84 prompts.
    proposals: int = 8  # Teacher completions per state.
    scoring_questions: int = 32  # Per task, from the start of the scoring split.
    mesh: MeshConfig = MeshConfig()
    teacher: TeacherSpec = TeacherSpec()
    solver: SolverSpec = COLLECT_SOLVER
    tasks: TaskSpec = TaskSpec(role="sft")
    sandbox: SandboxConfig = SandboxConfig(workers=4, slots_per_worker=8, timeout_s=60.0)
    prompt: PromptConfig = PromptConfig()
    # Teacher prompts show, as history (prompt.history, which must be on), the teacher's proposals for
    # the same task at earlier feedback rounds, so SFT rows teach reading a history. Off: the paper's.
    history: bool = False
    # Reasoning Gym's contract lets a harness set every sampling keyword, so the task fixes none;
    # misuse of the solver handle itself is refused regardless (filters.solver_settings).
    filters: FilterConfig = FilterConfig()

    def __post_init__(self):
        need = []
        if not self.out.endswith(".jsonl"):
            need.append(f"out ending in .jsonl (got {self.out!r})")
        if self.teacher.backend == "remote" and not self.teacher.url:
            need.append("teacher.url (the teacher's server)")
        if self.teacher.backend == "remote" and self.teacher.api == "sglang" and not self.teacher.path:
            need.append("teacher.path (the teacher's HF folder, for its chat template)")
        if self.teacher.backend == "remote" and self.teacher.api == "openai" and not self.teacher.model:
            need.append("teacher.model (the served model's name)")
        if self.solver.backend == "sglang" and not (self.solver.url and self.solver.path):
            need.append("solver.url and solver.path (the solver's server, and its HF folder for the chat template)")
        if self.solver.backend == "embedded" and not self.solver.path and self.teacher.backend == "remote":
            need.append("solver.path (the solver's HF folder; only an embedded teacher's weights are a default)")
        if self.tasks.suite == "multihop_qa" and not self.tasks.qa_files:
            need.append("tasks.qa_files ('dataset:path' of the QA data)")
        if need:
            raise ConfigError("this config needs " + "; ".join(need))
        for name in ("rounds", "proposals", "scoring_questions"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.history and not self.prompt.history.enabled:
            raise ConfigError("history=True needs prompt.history.mode 'last' or 'pareto' (the section to show it in)")
        if self.scoring_questions > self.tasks.scoring:
            raise ConfigError(f"scoring_questions={self.scoring_questions} exceeds tasks.scoring={self.tasks.scoring}")

    @classmethod
    def from_config(cls, cfg: ml_collections.ConfigDict) -> CollectConfig:
        return typed(cls, cfg.to_dict(), "config")

    @property
    def stem(self) -> str:
        return self.out[: -len(".jsonl")]

    @property
    def rejected_path(self) -> str:
        return self.stem + ".rejected.jsonl"
