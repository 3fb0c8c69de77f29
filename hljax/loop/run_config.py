"""The typed config of test-time adaptation and evaluation runs (`launch.adapt`, `launch.evaluate`).

Its defaults are the schema: configs/adapt_base.py is `config_tree(EvalRunConfig)`, and experiment
configs override fields of it. Built from a locked ml_collections config by `typed`
(hljax/config.py): unknown keys, wrong types and bad values fail at start-up, naming the key.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, NamedTuple

import ml_collections

from hljax.config import FLAT, RUN_SANDBOX, ConfigError, DistributedSpec, ServingSpec, SolverSpec, TaskSpec, typed
from hljax.harness.prompts import PromptConfig
from hljax.loop.adapt import AdaptConfig
from hljax.loop.rewards import RewardConfig
from hljax.mesh import MeshConfig
from sandbox.config import SandboxConfig


@dataclasses.dataclass(frozen=True)
class ProposerEntry:
    """One row of the results table: a frozen proposer."""

    label: str  # "base", "sft", "rl", "teacher", ...
    path: str = ""  # HF folder: served by our engine behind the SGLang API; or the tokenizer of `url`.
    url: str = ""  # A running SGLang (or compatible) server.

    @classmethod
    def parse(cls, entry: str) -> ProposerEntry:
        """"label=/path/to/hf_folder" or "label=http://host:port" (optionally "|/tokenizer/folder")."""
        label, sep, where = entry.partition("=")
        if not sep or not label or not where:
            raise ConfigError(f"proposers entry {entry!r} must be 'label=HF folder' or 'label=http://host:port'")
        if where.startswith(("http://", "https://")):
            url, _, tokenizer = where.partition("|")
            return cls(label, tokenizer, url)
        return cls(label, where)


class Row(NamedTuple):
    """A row of the results table: a proposer and the prompt it is shown."""

    label: str
    entry: ProposerEntry
    prompt: PromptConfig


HISTORY_SUFFIX = "+history"  # The label suffix of a proposer's row with history (evaluation.compare_history).


@dataclasses.dataclass(frozen=True)
class ProposerServing:
    """How the proposers are prompted, and how an HF-folder one is served (our engine behind the
    SGLang API)."""

    # Qwen3's thinking mode in the proposer's chat template (every proposer of the table). False, as
    # in training (model.enable_thinking): the template's empty think block, an edit straight away.
    enable_thinking: bool = False
    # Embedded proposer server:
    serving: ServingSpec = dataclasses.field(default=ServingSpec(max_seq_len=8192), metadata={FLAT: True})


@dataclasses.dataclass(frozen=True)
class EvaluationSpec:
    # single: each task's seed harness gets `adapt.proposals` independent proposals, each scored on
    # evaluation questions (the paper's single-revision protocol). rounds: `adapt.runs` runs of
    # `adapt.rounds` rounds (multistep / QA runs); the harness kept after each round is evaluated.
    protocol: Literal["single", "rounds"] = "rounds"
    eval_questions: int = 64  # From the eval split, disjoint from feedback and scoring questions.
    # Each proposer runs twice, with the same seeds and questions: row `<label>` with the paper's
    # prompt (no history) and row `<label>+history` with prompt.history (which must be on).
    compare_history: bool = False


@dataclasses.dataclass(frozen=True)
class ReportSpec:
    html: bool = True  # A static HTML page per run (tree, diffs, scores) and an index.
    plots: bool = True  # Write the score-vs-round plots.


@dataclasses.dataclass(frozen=True)
class EvalRunConfig:
    run_dir: str = "runs/eval"  # Rounds, harnesses, reports, tables; rerunning on it resumes.
    seed: int = 0  # Questions, sampling and selection derive from it.
    # Rows of the results table, in a config as strings: "label=HF folder" (served by our engine behind
    # the SGLang API) or "label=http://host:port" (a running SGLang server; "|/hf/folder" after the URL
    # names its tokenizer). At least one is required.
    proposers: tuple[ProposerEntry, ...] = ()
    proposer: ProposerServing = ProposerServing()
    solver: SolverSpec = SolverSpec()  # solver.path "" = the first proposer's folder.
    tasks: TaskSpec = TaskSpec(role="heldout")
    adapt: AdaptConfig = AdaptConfig()
    evaluation: EvaluationSpec = EvaluationSpec()
    sandbox: SandboxConfig = RUN_SANDBOX
    reward: RewardConfig = RewardConfig()
    prompt: PromptConfig = PromptConfig()
    mesh: MeshConfig = MeshConfig()
    distributed: DistributedSpec = DistributedSpec()
    report: ReportSpec = ReportSpec()

    def __post_init__(self):
        if not self.proposers:
            raise ConfigError("proposers: name at least one 'label=HF folder' or 'label=http://host:port'")
        labels = [p.label for p in self.proposers]
        if len(set(labels)) != len(labels) or "seed" in labels:
            raise ConfigError(f"proposers: labels must be unique and not 'seed', got {labels}")
        if self.evaluation.compare_history:
            if not self.prompt.history.enabled:
                raise ConfigError("evaluation.compare_history needs prompt.history.mode 'last' or 'pareto' "
                                  "(the history the '+history' rows show)")
            rows = [r.label for r in self.rows()]
            if len(set(rows)) != len(rows):
                raise ConfigError(f"proposers: with evaluation.compare_history the rows {rows} must be unique")
        if self.solver.backend == "embedded" and not self.solver_path:
            raise ConfigError("solver.path: the solver's HF folder (or give the first proposer as an HF folder)")

    def rows(self) -> list[Row]:
        """The results table's proposer rows in order: each proposer as configured, or with
        evaluation.compare_history, first without history and then with it."""
        if not self.evaluation.compare_history:
            return [Row(p.label, p, self.prompt) for p in self.proposers]
        plain = dataclasses.replace(self.prompt, history=dataclasses.replace(self.prompt.history, mode="off"))
        return [r for p in self.proposers
                for r in (Row(p.label, p, plain), Row(p.label + HISTORY_SUFFIX, p, self.prompt))]

    @property
    def solver_path(self) -> str:
        """The solver's HF folder: solver.path, else the first proposer's folder (the paper's RG setup
        uses one model as base proposer and solver)."""
        return self.solver.path or self.proposers[0].path

    @classmethod
    def from_config(cls, cfg: ml_collections.ConfigDict) -> EvalRunConfig:
        d = cfg.to_dict()
        d["proposers"] = tuple(ProposerEntry.parse(e) for e in d.get("proposers", ()))
        return typed(cls, d, "config")
