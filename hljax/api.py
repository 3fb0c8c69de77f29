"""hljax from Python, for people who would rather call functions than launchers (docs/tasks.md).

The functions build and use the launchers' own objects: the typed run configs, `Endpoint`s for the
proposer and solver, the `SandboxPool`, `run_adaptation` and the evaluation protocols, so a run made
here is a run `launch.adapt` would make (same files, resumable by either).

    from hljax import api

    cfg = api.eval_config(proposers={"tiny": "runs/tiny/export"}, run_dir="runs/mine",
                          overrides={"tasks.suite": "examples/unit_conversion/task.py",
                                     "tasks.families": (), "solver.backend": "simulated"})
    summary = api.evaluate(cfg)                    # launch.evaluate / launch.adapt, preflight included
    (task,) = api.load_tasks(cfg.tasks, cfg.seed)
    with api.open_solver(cfg) as solver, api.open_pool(cfg, solver) as pool, \\
            api.open_proposer(cfg, "tiny") as proposer:
        rounds = api.adapt(task, proposer, pool, cfg, "runs/mine/by_hand")  # T rounds on one task
        scores = api.score(pool, task, api.kept_harness("runs/mine/by_hand"), "eval", 32)
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Iterator, Mapping, Sequence

from hljax import preflight
from hljax import sharding as shd
from hljax.config import ConfigError, TaskSpec, config_tree
from hljax.endpoints import Endpoint, solver_spec
from hljax.loop import records as rec
from hljax.loop.adapt import question_scores, run_adaptation
from hljax.loop.evaluate import proposer_spec, run
from hljax.loop.run_config import EvalRunConfig
from hljax.tasks.base import Question, Task
from hljax.tasks.jobs import run_codes
from hljax.tasks.suite import build_tasks, load_suite
from sandbox.pool import SandboxPool


def eval_config(proposers: Mapping[str, str], run_dir: str, overrides: Mapping[str, Any] = ()) -> EvalRunConfig:
    """An adaptation / evaluation config: the schema's defaults (configs/adapt_base.py), `proposers`
    (label -> HF folder or server URL), and `overrides` by dotted key ("adapt.rounds": 5). A misspelt
    key or a bad value raises ConfigError naming it, as on the command line."""
    tree = config_tree(EvalRunConfig)
    tree.run_dir = run_dir
    tree.proposers = tuple(f"{label}={where}" for label, where in proposers.items())
    for key, value in dict(overrides).items():
        try:
            tree.update_from_flattened_dict({key: value})
        except (KeyError, AttributeError, TypeError) as e:  # Unknown keys are named by from_config below.
            raise ConfigError(f"{key}={value!r}: {e}") from e
    return EvalRunConfig.from_config(tree)


def load_tasks(spec: TaskSpec | str, seed: int = 0) -> list[Task]:
    """The tasks of a TaskSpec, or of a suite reference ("reasoning_gym", "path/to/task.py") with
    the default split sizes."""
    return build_tasks(TaskSpec(suite=spec) if isinstance(spec, str) else spec, seed)


def evaluate(cfg: EvalRunConfig) -> dict:
    """What `launch.evaluate` (evaluation.protocol "single") or `launch.adapt` ("rounds") does: the
    start-up checks, then every proposer on every task; -> the summary (results tables, plot, HTML)."""
    preflight.evaluate(cfg)
    return run(cfg)


@contextlib.contextmanager
def open_solver(cfg: EvalRunConfig) -> Iterator[Endpoint]:
    """The run's solver (`cfg.solver`), stopped on exit."""
    with Endpoint(solver_spec(cfg.solver, cfg.solver_path, cfg.seed), shd.make_mesh(cfg.mesh), name="solver") as e:
        yield e


@contextlib.contextmanager
def open_proposer(cfg: EvalRunConfig, label: str) -> Iterator[Endpoint]:
    """The proposer `label` of `cfg.proposers`, served as launch.evaluate serves it."""
    entries = {p.label: p for p in cfg.proposers}
    if label not in entries:
        raise ConfigError(f"proposers: no proposer labelled {label!r}; labels: {sorted(entries)}")
    with Endpoint(proposer_spec(cfg, entries[label]), shd.make_mesh(cfg.mesh), name=f"proposer {label}") as e:
        yield e


@contextlib.contextmanager
def open_pool(cfg: EvalRunConfig, solver: Endpoint) -> Iterator[SandboxPool]:
    """The sandbox that runs harnesses (`cfg.sandbox`) with `solver` behind it."""
    with SandboxPool(cfg.sandbox, solver.generator, cfg.solver.budget) as pool:
        yield pool


def adapt(task: Task, proposer: Endpoint, pool: SandboxPool, cfg: EvalRunConfig, directory: str,
          harness: str | None = None, run_index: int = 0) -> list[rec.RoundRecord]:
    """`cfg.adapt.rounds` revision rounds of `harness` (default: the suite's seed harness) on `task`,
    persisted under `directory` (rerunning resumes); -> the rounds. `rec.RunStore(directory)` reads
    every harness back (`.harness(round.selected)`)."""
    code = harness if harness is not None else load_suite(cfg.tasks.suite).seed_harness
    return run_adaptation(task, code, proposer.generator, pool, cfg.adapt, rec.RunStore(directory), seed=cfg.seed,
                          run_index=run_index, prompt=cfg.prompt, reward=cfg.reward,
                          enable_thinking=cfg.proposer.enable_thinking)


def kept_harness(directory: str) -> str:
    """The harness an adaptation run under `directory` kept after its last round."""
    store = rec.RunStore(directory)
    rounds = store.rounds()
    return store.harness(rounds[-1].selected if rounds else rec.SEED_ID)


def score(pool: SandboxPool, task: Task, harness: str, split: str = "eval", n: int = 16,
          questions: Sequence[Question] | None = None) -> list[float]:
    """Per-question scores of `harness` on the first `n` questions of `split` (or on `questions`)."""
    qs = list(questions) if questions is not None else task.take(split, n)
    (results,) = run_codes(pool, task, [harness], qs)
    return list(question_scores(results))


def replace(cfg: EvalRunConfig, **changes) -> EvalRunConfig:
    """`cfg` with top-level fields changed (a config is frozen), e.g. replace(cfg, run_dir="runs/b")."""
    return dataclasses.replace(cfg, **changes)
