"""Find a run's task suite by `tasks.suite`, build its tasks, and give the seed harness they start from.

`tasks.suite` is a name registered in SUITES (the built-in suites), a task file `path/to/task.py`,
or `package.module:NAME` (docs/tasks.md). A built-in suite is one module that defines `SUITE` plus
one line here.
"""

from __future__ import annotations

import importlib

from hljax.tasks.base import Suite, Task
from hljax.tasks.splits import SplitConfig

SUITES = {
    "reasoning_gym": "hljax.tasks.reasoning_gym:SUITE",
    "multihop_qa": "hljax.tasks.multihop_qa:SUITE",
}


def split_config(feedback: int, scoring: int, eval_: int, seed: int) -> SplitConfig:
    # Equal thirds of the hash space; the sizes only say how many questions each split takes.
    return SplitConfig(seed=seed, feedback_size=feedback, scoring_size=scoring, eval_size=eval_)


def load_suite(ref: str) -> Suite:
    """The suite `ref` names; ValueError (a plugin.TaskFileError for task files) naming the fix."""
    if ref in SUITES:
        module, _, attr = SUITES[ref].partition(":")
        return getattr(importlib.import_module(module), attr)
    if ref.endswith(".py") or ":" in ref:
        from hljax.tasks import plugin  # Only runs on a user's task import it.

        return plugin.load(ref)
    raise ValueError(f"tasks.suite={ref!r} is not a built-in suite ({', '.join(SUITES)}), a task file "
                     "(path/to/task.py) or 'package.module:NAME' (docs/tasks.md)")


def build_tasks(spec, seed: int, suite: Suite | None = None) -> list[Task]:
    """`spec`: a run's TaskSpec (suite, role/families or QA files, split sizes); `suite`: its Suite
    when the caller has loaded it already (a task file is imported once, not per call)."""
    splits = split_config(spec.feedback, spec.scoring, spec.eval, seed)
    return (suite or load_suite(spec.suite)).build(spec, splits, seed)


def tasks_and_seed_harness(spec, seed: int) -> tuple[list[Task], str]:
    """A run's tasks and the source of the harness every one of them starts from (one suite load)."""
    suite = load_suite(spec.suite)
    return build_tasks(spec, seed, suite), suite.seed_harness
