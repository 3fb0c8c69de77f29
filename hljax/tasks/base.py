"""The `Task` protocol every task suite implements (Reasoning Gym, multi-hop QA, a user's own task
file: docs/tasks.md), the `Suite` that builds a run's tasks, and their value types.

A task owns its questions (split into feedback / scoring / eval, see splits.py), scores answers and
supplies the tools a harness may call. Only `Question.text` ever enters the sandbox: the reference
and the task's private data (`payload`) stay on the trusted side with the scorer and the tools.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator, Literal, Mapping, Protocol

from hljax.harness.contract import ToolSpec
from sandbox.results import ScorerSpec

Split = Literal["feedback", "scoring", "eval"]
SPLITS: tuple[Split, ...] = ("feedback", "scoring", "eval")


@dataclasses.dataclass(frozen=True)
class Question:
    """One question of a task. Identity is `qid`; the other fields follow from it."""

    qid: str  # Stable hashed id (splits.question_id): the unit of split assignment.
    text: str  # Everything the harness sees, instructions included; never contains the reference.
    answer: str  # The reference as shown in reports and logs; never sent to the sandbox.
    # Task-private data for the scorer and the tools (a Reasoning Gym entry, a QA question's
    # paragraphs and gold aliases). Excluded from equality and hashing: qid decides both.
    payload: Any = dataclasses.field(default=None, compare=False, repr=False)


@dataclasses.dataclass(frozen=True)
class Score:
    """The outcome of scoring one answer."""

    value: float  # In [0, 1]; 0 when the answer could not be scored.
    # The task's scorer raised on this answer (untrusted text makes some scorers raise): scored 0
    # and reported as a scorer error, never as a harness crash. "" otherwise.
    error: str = ""
    # Why the answer scored 0 without an error, e.g. the requested answer format was not followed.
    note: str = ""


class Task(Protocol):
    """Everything the loops call on a task: adaptation, evaluation, GRPO rollouts and SFT collection."""

    @property
    def name(self) -> str:
        """Short unique name, e.g. "rg/gcd" or "hotpotqa"."""
        ...

    @property
    def description(self) -> str:
        """Task description text for the proposer prompt (never shows scoring or eval questions)."""
        ...

    @property
    def tool_specs(self) -> tuple[ToolSpec, ...]:
        """The tools harnesses may call, as the proposer reads them (empty if none)."""
        ...

    def questions(self, split: Split) -> Iterator[Question]:
        """The split's configured number of questions, in a fixed order."""
        ...

    def feedback_round(self, round_index: int) -> list[Question]:
        """Fresh feedback questions for revision round `round_index` (disjoint across rounds)."""
        ...

    def take(self, split: Split, n: int, start: int = 0) -> list[Question]:
        """Questions [start, start + n) of `split` in a fixed order (scoring windows, evaluation
        sets larger than configured); splits.SplitExhausted if the split has fewer."""
        ...

    def score(self, answer: str, question: Question) -> Score:
        """Score an answer in this process: for trusted text only (references, tests). Never raises:
        a scorer exception becomes `Score(0, error=...)`. Harness answers are scored through
        `scorer_spec` and `score_payload` in the pool's scorer process (hljax/tasks/jobs.py)."""
        ...

    def scorer_spec(self) -> ScorerSpec:
        """How the isolated scorer process rebuilds this task's scorer (see hljax/tasks/scorers.py)."""
        ...

    def score_payload(self, question: Question) -> Any:
        """What that scorer needs for `question` besides the answer (picklable; holds the reference)."""
        ...

    def tools(self, question: Question) -> Mapping[str, Callable[..., Any]]:
        """The question's tool functions by name (keys match `tool_specs`); they return JSON values."""
        ...


@dataclasses.dataclass(frozen=True)
class Suite:
    """A task suite as a run finds it by `tasks.suite` (hljax/tasks/suite.py): how to build its tasks
    and the harness revision starts from."""

    name: str
    # (TaskSpec, SplitConfig, seed) -> tasks; the spec's suite-specific fields (families, QA files)
    # are the suite's to read; a bad value raises ValueError naming the key and the fix.
    build: Callable[[Any, Any, int], list[Task]]
    seed_harness: str  # Source of the seed harness h_0 (a module defining solve(question, solver)).
    names: tuple[str, ...] = ()  # Its task names where known without building (tasks.families checks).


def guarded(score_fn: Callable[[], float]) -> Score:
    """Run a scorer; an exception or a non-finite or out-of-range value scores 0 with an error."""
    try:
        value = float(score_fn())
    except Exception as e:  # noqa: BLE001 - untrusted answers make third-party scorers raise anything.
        return Score(0.0, error=f"{type(e).__name__}: {e}")
    if not 0.0 <= value <= 1.0:  # Also catches NaN.
        return Score(0.0, error=f"scorer returned {value}, outside [0, 1]")
    return Score(value)
