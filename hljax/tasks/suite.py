"""Build the tasks a run revises harnesses for, and the seed harness they start from."""

from __future__ import annotations

import dataclasses
from typing import Sequence

from hljax.tasks.base import Task
from hljax.tasks.multihop_qa import MultiHopQATask, QATaskConfig
from hljax.tasks.reasoning_gym import FamilyLists, ReasoningGymTask, RGTaskConfig, family_tasks
from hljax.tasks.splits import SplitConfig

SEED_HARNESS = {"reasoning_gym": "reasoning", "multihop_qa": "multihop_qa"}


def split_config(feedback: int, scoring: int, eval_: int, seed: int) -> SplitConfig:
    # Equal thirds of the hash space; the sizes only say how many questions each split takes.
    return SplitConfig(seed=seed, feedback_size=feedback, scoring_size=scoring, eval_size=eval_)


def build_tasks(spec, seed: int) -> list[Task]:
    """`spec`: a run's TaskSpec (suite, role/families or QA files, split sizes)."""
    splits = split_config(spec.feedback, spec.scoring, spec.eval, seed)
    if spec.suite == "reasoning_gym":
        lists = FamilyLists.shipped()
        families = spec.families or lists.families(spec.role)
        base = RGTaskConfig(family=families[0], generator_seed=seed, pool_size=spec.pool_size, splits=splits,
                            **({"formats": tuple(spec.formats)} if spec.formats else {}))
        if spec.families:
            unknown = [f for f in spec.families if f not in lists.families(spec.role)]
            if unknown:
                raise ValueError(f"tasks.families {unknown} are not in the {spec.role!r} list of "
                                 "hljax/tasks/rg_families.py")
            return [ReasoningGymTask(dataclasses.replace(base, family=f)) for f in families]
        return list(family_tasks(lists, spec.role, base).values())
    if spec.suite == "multihop_qa":
        if not spec.qa_files:
            raise ValueError("tasks.qa_files must name at least one dataset:path for the multihop_qa suite")
        return [MultiHopQATask(QATaskConfig(dataset=name, path=path, splits=splits,
                                            aliases_path=_aliases(spec.qa_aliases, name)))
                for name, path in _pairs(spec.qa_files)]
    raise ValueError(f"unknown task suite {spec.suite!r}; valid: {sorted(SEED_HARNESS)}")


def _pairs(entries: Sequence[str]) -> list[tuple[str, str]]:
    out = []
    for entry in entries:
        name, sep, path = entry.partition(":")
        if not sep:
            raise ValueError(f"tasks.qa_files entry {entry!r} must be 'dataset:path'")
        out.append((name, path))
    return out


def _aliases(path: str, dataset: str) -> str | None:
    return path or None if dataset == "2wikimultihopqa" else None
