"""Reward of a proposed revision: the candidate's mean score on the scoring set plus a validity shaping.

Ordering at equal score: invalid edit < valid edit whose harness errs on some question < harness
that runs cleanly on every question. `NoOp` and `Truncated` are invalid. A candidate touched by an
infrastructure error gets no reward at all (it is dropped from the loss), never a score of 0.

Reward-hacking guards. References never enter the sandbox (`sandbox.results.Job`; proved by
tests/test_reward_guards.py), so a harness cannot read them; these flags catch the attempts and
the degenerate policy that needs no reference at all. A flagged candidate gets `invalid_reward`
(no validity bonus, no score) and kind "flagged:<first flag>"; its measured score is kept in
`Outcome.score` so metrics still show what it scored.
- reference_access: the code reaches for references or the machine (imports of os/sys/gc/inspect,
  open/eval/exec, frame or dunder attributes, .reference/.answer/.payload, filesystem paths; the
  static scan `hljax.harness.filters.reference_access`).
- constant_answer: every scoring question that got an answer got the same one, after
  `filters.normalize` (strip, collapse whitespace, case-fold). Not raised when fewer than two
  questions were answered (one answer is trivially "constant"), when the shared answer is empty
  (it scores 0 everywhere, nothing to hack), or when the references themselves are all identical
  after normalisation (then one constant answer is legitimately right). Without `references` the
  last exemption cannot be checked, and identical answers are flagged.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Literal, Sequence

from hljax.harness import edits, filters
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


# What happened to a proposal. The harness ran: "ran" (it answered every scoring question cleanly),
# "crashed" (it erred on some), "infra_error" (the sandbox or solver failed: no reward at all). The
# edit failed: the class name of the failure (hljax.harness.edits, or contract.ContractViolation for
# code that breaks the harness contract). A reward-hacking flag was raised: "flagged:<flag>" (the
# first one). Kept in this order: rollout statistics code a kind by its index here.
OutcomeKind = Literal["ran", "crashed", "infra_error", "Unparseable", "Truncated", "SpanNotFound", "AmbiguousSpan",
                      "Overlapping", "NoOp", "SyntaxInvalid", "ContractViolation", "flagged:reference_access",
                      "flagged:constant_answer"]
OUTCOME_KINDS: tuple[OutcomeKind, ...] = typing.get_args(OutcomeKind)
RUN_KINDS: tuple[OutcomeKind, ...] = ("ran", "crashed", "infra_error")  # The harness ran, unflagged.
FLAGS = ("reference_access", "constant_answer")
FLAGGED_KINDS: tuple[OutcomeKind, ...] = ("flagged:reference_access", "flagged:constant_answer")  # One per flag.


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What happened to one proposal."""

    kind: OutcomeKind
    score: float  # Mean scoring-set score (0 unless the edit was valid; measured even when flagged).
    reward: float | None  # None: infrastructure failure, excluded from training.
    flags: tuple[str, ...] = ()  # Reward-hacking flags raised (see FLAGS).


def failure_kind(result: Candidate) -> OutcomeKind | None:
    """None if the edit gave a new harness that compiles and keeps the contract; else why not."""
    return None if isinstance(result, edits.Applied) else type(result).__name__


def constant_answer(results: Sequence[JobResult], references: Sequence[str] | None = None) -> bool:
    """Every answered scoring question got the same non-empty answer (see the module docstring)."""
    answers = {filters.normalize(r.answer) for r in results if r.status == "ok" and r.answer is not None}
    answered = sum(r.status == "ok" and r.answer is not None for r in results)
    if answered < 2 or len(answers) != 1 or answers == {""}:
        return False
    if references is not None and len({filters.normalize(str(x)) for x in references}) == 1:
        return False
    return True


def flags(results: Sequence[JobResult], code: str | None = None,
          references: Sequence[str] | None = None) -> tuple[str, ...]:
    """Reward-hacking flags of one candidate: its scoring `results`, its `code` (None skips the static
    scan) and the scoring questions' `references`, in result order."""
    out = []
    if code is not None and filters.reference_access(code):
        out.append("reference_access")
    if constant_answer(results, references):
        out.append("constant_answer")
    return tuple(out)


def flag_counts(outcomes: Sequence[Outcome]) -> dict[str, float]:
    """Metric entries "flag/<name>": how many of `outcomes` raised each flag (every name, 0 included)."""
    return {f"flag/{name}": float(sum(name in o.flags for o in outcomes)) for name in FLAGS}


def outcome(cfg: RewardConfig, edit_result: Candidate, results: Sequence[JobResult] | None,
            references: Sequence[str] | None = None) -> Outcome:
    """`results`: the candidate's runs on the scoring questions (None when the edit was invalid);
    `references`: those questions' reference answers, for the constant-answer exemption."""
    kind = failure_kind(edit_result)
    if kind is not None:
        return Outcome(kind, 0.0, cfg.invalid_reward)
    if results is None or not results:
        raise ValueError("a valid edit needs its scoring results")
    if any(r.is_infra_error for r in results):
        return Outcome("infra_error", 0.0, None)
    score = sum(r.score or 0.0 for r in results) / len(results)
    raised = flags(results, edit_result.code, references)
    if raised:
        return Outcome(f"flagged:{raised[0]}", score, cfg.invalid_reward, raised)
    ran = all(r.status == "ok" for r in results)
    reward = cfg.score_weight * score + cfg.valid_bonus + (cfg.ran_bonus if ran else 0.0)
    return Outcome("ran" if ran else "crashed", score, reward)
