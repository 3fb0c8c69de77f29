"""`ExecutionReport`: what running a harness on feedback questions showed, and its prompt rendering.

Built from the sandbox's results on feedback questions only: it shows references, so it must
never be built from scoring or evaluation questions. Infrastructure errors are counted but left
out of every rate and of the mean score, since they say nothing about the harness.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from sandbox.results import HarnessError, Job, JobResult, Status

_FAILED: tuple[Status, ...] = ("error", "timeout", "crashed")


@dataclasses.dataclass(frozen=True)
class QuestionReport:
    """One feedback question's run."""

    question: str
    reference: str | None
    answer: str | None
    score: float | None
    status: Status
    error: HarnessError | None
    reason: str  # For timeout / crashed / infra_error.
    scorer_error: str  # The scorer failed on this answer (scored 0); often a format problem.
    stdout_tail: str
    stderr_tail: str
    solver_calls: int
    prompt_tokens: int
    completion_tokens: int
    tool_calls: int
    run_s: float


@dataclasses.dataclass(frozen=True)
class ExecutionReport:
    questions: tuple[QuestionReport, ...]

    @classmethod
    def from_results(cls, jobs: Sequence[Job], results: Sequence[JobResult]) -> ExecutionReport:
        if len(jobs) != len(results):
            raise ValueError(f"{len(jobs)} jobs but {len(results)} results")
        return cls(
            tuple(
                QuestionReport(
                    question=j.question,
                    reference=None if j.reference is None else str(j.reference),
                    answer=r.answer,
                    score=r.score,
                    status=r.status,
                    error=r.error,
                    reason=r.reason,
                    scorer_error=r.scorer_error,
                    stdout_tail=r.stdout_tail,
                    stderr_tail=r.stderr_tail,
                    solver_calls=r.solver_calls,
                    prompt_tokens=r.prompt_tokens,
                    completion_tokens=r.completion_tokens,
                    tool_calls=r.tool_calls,
                    run_s=r.run_s,
                )
                for j, r in zip(jobs, results)
            )
        )

    # ----- aggregates (infrastructure errors excluded) ----------------------------------------

    @property
    def counted(self) -> tuple[QuestionReport, ...]:
        return tuple(q for q in self.questions if q.status != "infra_error")

    @property
    def infra_errors(self) -> int:
        return len(self.questions) - len(self.counted)

    def _rate(self, statuses: tuple[Status, ...]) -> float:
        counted = self.counted
        return sum(q.status in statuses for q in counted) / len(counted) if counted else 0.0

    @property
    def mean_score(self) -> float:
        """Mean over counted questions; a question that did not return an answer scores 0."""
        counted = self.counted
        return sum(q.score or 0.0 for q in counted) / len(counted) if counted else 0.0

    @property
    def error_rate(self) -> float:
        """Share of counted questions that raised or crashed (timeouts are separate)."""
        return self._rate(("error", "crashed"))

    @property
    def timeout_rate(self) -> float:
        return self._rate(("timeout",))

    # ----- rendering ----------------------------------------------------------------------------

    def render(
        self,
        max_chars: int | None = None,
        max_tokens: int | None = None,
        count_tokens: Callable[[str], int] | None = None,
    ) -> str:
        """Compact text for the proposer prompt, within `max_chars` and/or `max_tokens`.

        Detail shrinks level by level (question, answer, traceback and output lengths), then whole
        questions are left out (successes before failures), then the text is cut as a last resort.
        """
        if max_tokens is not None and count_tokens is None:
            raise ValueError("max_tokens needs count_tokens")

        def fits(text: str) -> bool:
            return (max_chars is None or len(text) <= max_chars) and (
                max_tokens is None or count_tokens(text) <= max_tokens
            )

        shown = self._by_interest()
        for level in _LEVELS:
            text = self._render(shown, level, omitted=0)
            if fits(text):
                return text
        leanest = _LEVELS[-1]
        while shown:
            shown = shown[:-1]
            text = self._render(shown, leanest, omitted=len(self.counted) - len(shown))
            if fits(text):
                return text
        return _cut_to_fit(text, fits)

    def _by_interest(self) -> list[tuple[int, QuestionReport]]:
        """Failures first, then by ascending score: what the proposer most needs to see."""
        indexed = [(i, q) for i, q in enumerate(self.questions) if q.status != "infra_error"]
        return sorted(indexed, key=lambda iq: (iq[1].status not in _FAILED, iq[1].score or 0.0))

    def _header(self) -> str:
        counted = self.counted
        n = len(counted)
        errors = sum(q.status == "error" for q in counted)
        crashes = sum(q.status == "crashed" for q in counted)
        timeouts = sum(q.status == "timeout" for q in counted)
        calls = sum(q.solver_calls for q in counted) / n if n else 0.0
        tokens = sum(q.prompt_tokens + q.completion_tokens for q in counted) / n if n else 0.0
        head = (
            f"{n} feedback questions: mean score {self.mean_score:.3f}; "
            f"{errors} raised, {crashes} crashed, {timeouts} timed out "
            f"(error rate {self.error_rate:.0%}, timeout rate {self.timeout_rate:.0%}); "
            f"per question {calls:.1f} solver calls, {tokens:.0f} tokens."
        )
        if self.infra_errors:
            head += f" {self.infra_errors} more not run (sandbox or solver failure, not the harness's fault)."
        return head

    def _render(self, shown: list[tuple[int, QuestionReport]], level: _Level, omitted: int) -> str:
        parts = [self._header()]
        parts += [_render_question(i, q, level) for i, q in shown]
        if omitted:
            parts.append(f"[{omitted} more questions not shown]")
        return "\n\n".join(parts)


@dataclasses.dataclass(frozen=True)
class _Level:
    question: int
    answer: int
    traceback: int
    output: int


_LEVELS = (
    _Level(question=800, answer=400, traceback=1500, output=600),
    _Level(question=400, answer=200, traceback=800, output=300),
    _Level(question=200, answer=120, traceback=400, output=120),
    _Level(question=100, answer=60, traceback=200, output=0),
)


def _head(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n] + f"...[{len(text) - n} more chars]"


def _tail(text: str, n: int) -> str:
    return text if len(text) <= n else f"[{len(text) - n} earlier chars]..." + text[-n:]


def _render_question(index: int, q: QuestionReport, level: _Level) -> str:
    score = "n/a" if q.score is None else f"{q.score:.2f}"
    lines = [f"### Question {index + 1}: {q.status}, score {score}", f"Question: {_head(q.question, level.question)}"]
    if q.reference is not None:
        lines.append(f"Reference answer: {_head(q.reference, level.answer)}")
    if q.answer is not None:
        lines.append(f"Harness answer: {_head(q.answer, level.answer)}")
    if q.error is not None:
        lines.append(f"Exception: {q.error.type}: {_head(q.error.message, level.answer)}")
        if level.traceback:
            lines.append("Traceback (last frames):\n" + _tail(q.error.traceback.rstrip(), level.traceback))
    if q.reason:
        lines.append(f"What happened: {q.reason}")
    if q.scorer_error:
        lines.append(f"The answer could not be scored (counted as 0): {_head(q.scorer_error, level.answer)}")
    for name, text in (("stdout", q.stdout_tail), ("stderr", q.stderr_tail)):
        if level.output and text.strip():
            lines.append(f"{name} (end):\n" + _tail(text.rstrip(), level.output))
    lines.append(
        f"Solver calls: {q.solver_calls} ({q.prompt_tokens} prompt + {q.completion_tokens} completion tokens)"
        + (f"; tool calls: {q.tool_calls}" if q.tool_calls else "")
        # Whole seconds, and only when it matters: milliseconds of jitter would change the proposer's
        # prompt, and with it the proposals of a resumed run.
        + (f"; time {q.run_s:.0f}s" if q.run_s >= 1.0 else "")
    )
    return "\n".join(lines)


def _cut_to_fit(text: str, fits: Callable[[str], bool]) -> str:
    """The longest prefix of `text` (plus a marker) that fits, by bisection."""
    marker = "\n[report cut to fit]"
    cut = text[:longest_fit(len(text), lambda n: fits(text[:n] + marker))] + marker
    return cut if fits(cut) else ""


def longest_fit(n: int, fits: Callable[[int], bool]) -> int:
    """The largest k in [0, n] with fits(k), by bisection (`fits` true up to some k, false after); 0 if none."""
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo
