"""Reward of a proposed revision: the candidate's mean score on the scoring set plus a validity shaping.

Ordering at equal score: invalid edit < valid edit whose harness errs on some question < harness
that runs cleanly on every question. `NoOp` and `Truncated` are invalid. A candidate touched by an
infrastructure error gets no reward at all (it is dropped from the loss), never a score of 0.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from hljax.harness import edits
from hljax.loop.revision import Candidate
from sandbox.results import JobResult


@dataclasses.dataclass(frozen=True)
class RewardConfig:
    score_weight: float = 1.0  # Times the mean scoring-set score.
    valid_bonus: float = 0.1  # The edit parsed, applied, changed the code and compiles.
    ran_bonus: float = 0.1  # ...and the harness returned an answer on every scoring question.
    invalid_reward: float = 0.0  # Everything else.

    def __post_init__(self):
        if self.invalid_reward >= self.valid_bonus:
            raise ValueError("invalid_reward must be below valid_bonus, or invalid edits are not ranked last")
        if self.ran_bonus <= 0:
            raise ValueError("ran_bonus must be > 0 so a harness that runs beats one that crashes")


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What happened to one proposal."""

    kind: str  # "ran" | "crashed" | an edit failure class name ("Unparseable", "NoOp", ...) | "infra_error"
    score: float  # Mean scoring-set score (0 unless the edit was valid).
    reward: float | None  # None: infrastructure failure, excluded from training.


def failure_kind(result: Candidate) -> str | None:
    """None if the edit gave a new harness that compiles and keeps the contract; else why not."""
    return None if isinstance(result, edits.Applied) else type(result).__name__


def outcome(cfg: RewardConfig, edit_result: Candidate, results: Sequence[JobResult] | None) -> Outcome:
    """`results`: the candidate's runs on the scoring questions (None when the edit was invalid)."""
    kind = failure_kind(edit_result)
    if kind is not None:
        return Outcome(kind, 0.0, cfg.invalid_reward)
    if results is None or not results:
        raise ValueError("a valid edit needs its scoring results")
    if any(r.is_infra_error for r in results):
        return Outcome("infra_error", 0.0, None)
    score = sum(r.score or 0.0 for r in results) / len(results)
    ran = all(r.status == "ok" for r in results)
    reward = cfg.score_weight * score + cfg.valid_bonus + (cfg.ran_bonus if ran else 0.0)
    return Outcome("ran" if ran else "crashed", score, reward)
