"""Task scorers as plain functions of (answer, payload), and the factories the scorer process builds them with.

The pool scores harness answers in its scorer process (sandbox/scoring.py), never in the trainer:
a task's `scorer_spec()` names a factory here with picklable arguments, and `score_payload(q)`
gives what the scoring function needs for question q. The trusted `Task.score` calls the same
functions in-process, for text that is not a harness's (references in tests).

This module is imported inside the scorer sandbox: it must import only what scoring needs (no jax).
"""

from __future__ import annotations

import ast
import functools
import importlib
from typing import Any, Mapping

from hljax.tasks.base import Score, guarded
from hljax.tasks.formats import FORMATS
from hljax.tasks.qa_metrics import best_over_golds, exact_match, f1_score
from sandbox.results import ScorerSpec

# Reasoning-gym modules whose scorer calls `eval` on the answer (hljax/tasks/rg_families.py
# SCORER_AUDIT). In the scorer process only, their `eval` is replaced by `ast.literal_eval`: the
# scorer still reads a board written as a Python literal, but no answer runs code. Isolation alone
# stops such code from reaching the trainer or other answers; this also stops it from choosing its
# own score (a child running the answer's code could write a forged result and exit).
LITERAL_EVAL_ONLY = ("reasoning_gym.games.n_queens",)


def _literal_eval(source, *_namespaces):
    return ast.literal_eval(source)


def score_reasoning_gym(dataset, answer: str, payload: Mapping[str, Any]) -> Score:
    """Read the answer out of `answer` in the demanded format, then reasoning-gym's own scorer."""
    fmt = payload["format"]
    extracted = FORMATS[fmt].extract(answer)
    if extracted is None:
        return Score(0.0, note=f"the answer is not in the requested format ({fmt})")
    return guarded(lambda: dataset.score_answer(extracted, dict(payload["entry"])))


def reasoning_gym_spec(family: str, generator_seed: int, pool_size: int) -> ScorerSpec:
    return ScorerSpec(
        f"{__name__}:reasoning_gym_scorer",
        (("family", family), ("generator_seed", generator_seed), ("pool_size", pool_size)),
    )


def reasoning_gym_scorer(family: str, generator_seed: int, pool_size: int):
    """Factory, run in the scorer process: the family's dataset, its evaluating scorers disarmed."""
    import reasoning_gym

    dataset = reasoning_gym.create_dataset(family, seed=generator_seed, size=pool_size)
    for name in LITERAL_EVAL_ONLY:
        importlib.import_module(name).eval = _literal_eval
    return functools.partial(score_reasoning_gym, dataset)


def score_qa(metric: str, yes_no_rule: bool, answer: str, golds: tuple[str, ...]) -> Score:
    """Exact match, or token F1 with the dataset's yes/no rule, best over the gold answer and aliases."""
    if metric == "em":
        return guarded(lambda: best_over_golds(exact_match, answer, golds))
    return guarded(lambda: best_over_golds(lambda p, g: f1_score(p, g, yes_no_rule=yes_no_rule), answer, golds))


def qa_spec(metric: str, yes_no_rule: bool) -> ScorerSpec:
    return ScorerSpec(f"{__name__}:qa_scorer", (("metric", metric), ("yes_no_rule", yes_no_rule)))


def qa_scorer(metric: str, yes_no_rule: bool):
    """Factory, run in the scorer process. The payload is the question's gold answers."""
    return functools.partial(score_qa, metric, yes_no_rule)
