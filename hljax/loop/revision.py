"""One revision round's pieces: a revision state, turning a proposal into a candidate, and scoring
candidates on the scoring set. Shared by training and test-time adaptation."""

from __future__ import annotations

import dataclasses
from typing import Sequence

from hljax.harness import contract, edits
from hljax.harness.history import HistoryEntry
from hljax.harness.prompts import PromptConfig, proposer_messages
from hljax.harness.report import ExecutionReport
from hljax.tasks.base import Question, Task
from hljax.tasks.jobs import run_codes, run_harness
from sandbox.pool import SandboxPool
from sandbox.results import JobResult

Candidate = edits.Applied | edits.Unparseable | edits.Truncated | edits.SpanNotFound | edits.AmbiguousSpan | \
    edits.Overlapping | edits.NoOp | edits.SyntaxInvalid | contract.ContractViolation


@dataclasses.dataclass(frozen=True)
class RevisionState:
    """What the proposer sees: a task, the current harness, its execution report, and the earlier
    candidates that led to it (shown only when the prompt's history is on)."""

    task: Task
    harness: str
    report: ExecutionReport
    round_index: int  # Which feedback window the report was built on.
    history: tuple[HistoryEntry, ...] = ()

    def messages(self, config: PromptConfig = PromptConfig(), count_tokens=None):
        return proposer_messages(self.task.description, self.harness, self.report, self.task.tool_specs, config,
                                 count_tokens, self.history)


def build_state(pool: SandboxPool, task: Task, harness: str, round_index: int,
                history: tuple[HistoryEntry, ...] = ()) -> RevisionState:
    """Run `harness` on round `round_index`'s fresh feedback questions and report on it."""
    jobs, results = run_harness(pool, task, harness, task.feedback_round(round_index))
    return RevisionState(task, harness, ExecutionReport.from_results(jobs, results), round_index, tuple(history))


def candidate(harness: str, completion: str) -> Candidate:
    """A proposal's edits applied to `harness`, or why they could not be: an edit failure, or code
    that compiles but breaks the harness contract."""
    result = edits.apply_completion(harness, completion)
    if isinstance(result, edits.Applied):
        violation = contract.check(result.code)
        if violation is not None:
            return violation
    return result


def score_candidates(
    pool: SandboxPool, task: Task, codes: Sequence[str], questions: Sequence[Question]
) -> list[list[JobResult]]:
    """Run every candidate on the same scoring questions, all in one pool batch."""
    return run_codes(pool, task, codes, questions)
