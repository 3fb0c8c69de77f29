"""What goes into the pool (`Job`) and what comes out (`JobResult`), one result per job, always."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Literal, Mapping

# (*args, **kwargs) -> a JSON value. Runs in the supervisor when harness code calls it; must be quick.
Tool = Callable[..., Any]

# ok:          the harness returned a string; it was scored (if a scorer was given).
# error:       the harness raised (SystemExit and solver-budget errors included) or broke the contract.
# timeout:     the job's own running time passed the deadline; it was killed.
# crashed:     the job process died without a result (signal, os._exit, closed or abused channel).
# infra_error: the sandbox or the Generator failed, not the harness. Never turn this into a reward.
Status = Literal["ok", "error", "timeout", "crashed", "infra_error"]


@dataclasses.dataclass(frozen=True)
class Job:
    """One harness run on one question.

    Only `code`, `question` and the tools' names enter the sandbox. `reference` goes to the scorer
    and `tools` run in the supervisor when the harness calls them: a QA question's `retrieve`, bound
    to that question's paragraphs, searches them there, so the paragraphs stay outside too.
    """

    code: str
    question: str
    reference: Any = None
    # name -> function(*args, **kwargs) returning a JSON value; seen by the harness as globals.
    tools: Mapping[str, Tool] | None = dataclasses.field(default=None, compare=False)
    tag: str = ""  # The caller's label (e.g. the question id), copied to the result.


@dataclasses.dataclass(frozen=True)
class HarnessError:
    """An exception raised by harness code, as the job process reported it."""

    type: str
    message: str
    traceback: str  # The last frames (harness frames show their source lines) and the exception line.


@dataclasses.dataclass(frozen=True)
class JobResult:
    """The outcome of one `Job`. Counts come from the supervisor, never from the job itself."""

    tag: str
    status: Status
    answer: str | None  # What `solve` returned; None unless status is "ok".
    score: float | None  # None when not scored (no scorer, or status other than "ok").
    error: HarnessError | None = None  # Set when status is "error".
    reason: str = ""  # Why, for timeout / crashed / infra_error; "" otherwise.
    scorer_error: str = ""  # The scorer raised or returned a non-number: scored 0, not a harness fault.
    stdout_tail: str = ""
    stderr_tail: str = ""
    stdout_bytes: int = 0  # All bytes written, including those dropped from the tail.
    stderr_bytes: int = 0
    solver_calls: int = 0  # Completions served (a batch of k prompts is k calls).
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tool_calls: int = 0
    run_s: float = 0.0  # The job's own running time (brokered calls excluded), as the deadline saw it.
    maxrss_kb: int = 0

    @property
    def is_infra_error(self) -> bool:
        return self.status == "infra_error"


@dataclasses.dataclass(frozen=True)
class ScorerSpec:
    """How the scorer process (sandbox/score_server.py) builds a task's scoring function.

    `factory` ("package.module:function") is imported there and called with `kwargs`, once per
    spec; it returns `fn(answer, payload)` giving a float or an object with `value` and `error`
    (hljax.tasks.base.Score). Its package must be in `SandboxConfig.scorer_packages`.
    """

    factory: str
    kwargs: tuple[tuple[str, Any], ...] = ()  # Hashable and picklable values only.


@dataclasses.dataclass(frozen=True)
class IsolatedScorer:
    """Scores a run's answers in the pool's scorer process, each in a fresh forked child.

    Untrusted answers never meet the scorer in the supervisor: a scorer that evaluates its answer
    (reasoning-gym's n_queens calls eval on it) can then change nothing outside that one child.
    """

    spec: ScorerSpec
    # Job tag -> what `fn` gets with the answer (the question's reference data); picklable.
    payloads: Mapping[str, Any] = dataclasses.field(compare=False)


# (answer, job) -> score in [0, 1] usually, run in the supervisor: only for scorers that compare
# text (tests). Anything that parses or evaluates answers (every task scorer) is an IsolatedScorer.
# Either way an exception or a non-finite value scores 0 with a scorer error.
Scorer = Callable[[str, Job], float] | IsolatedScorer
