"""Running a harness on a task's questions in the sandbox: questions become `Job`s, scores come back.

Only the question text and the tools' names enter the sandbox (tests/test_reward_guards.py searches a
job's objects, frames, memory and files for the reference and finds nothing). The reference goes into the job
for the execution report, the tools are the question's own bound functions (run by the pool in
the supervisor), and the scorer finds each question again by its id (the job's tag).
"""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

from hljax.tasks.base import Question, Task
from sandbox.pool import SandboxPool
from sandbox.results import IsolatedScorer, Job, JobResult


@runtime_checkable
class KnowsQuestions(Protocol):
    """A solver that answers from references it is told on the trusted side (the simulated solver)."""

    def register(self, task: Task, questions: Sequence[Question]) -> None: ...


def announce(pool: SandboxPool, task: Task, questions: Sequence[Question]) -> None:
    """Tell the pool's solver, if it answers from references, which questions are about to run.
    This happens here, in the trusted process: the sandbox never sees a reference."""
    if isinstance(pool.generator, KnowsQuestions):
        pool.generator.register(task, questions)


def make_jobs(task: Task, code: str, questions: Sequence[Question]) -> list[Job]:
    """One job per question, tagged with its id."""
    if len({q.qid for q in questions}) != len(questions):
        raise ValueError("questions repeat; the scorer finds them by id")
    return [
        Job(code=code, question=q.text, reference=q.answer, tools=dict(task.tools(q)) or None, tag=q.qid)
        for q in questions
    ]


def make_scorer(task: Task, questions: Sequence[Question]) -> IsolatedScorer:
    """The pool's scorer for jobs made from `questions`: the task's scorer rebuilt in the pool's
    scorer process (`task.scorer_spec()`), each question's payload found by its id (the job's tag).
    Harness answers are never scored in this process: some scorers evaluate them."""
    return IsolatedScorer(task.scorer_spec(), {q.qid: task.score_payload(q) for q in questions})


def run_harness(
    pool: SandboxPool, task: Task, code: str, questions: Sequence[Question]
) -> tuple[list[Job], list[JobResult]]:
    """Run `code` on every question; the jobs come back too, for `ExecutionReport.from_results`."""
    jobs = make_jobs(task, code, questions)
    announce(pool, task, questions)
    return jobs, pool.run(jobs, scorer=make_scorer(task, questions))


def run_codes(pool: SandboxPool, task: Task, codes: Sequence[str], questions: Sequence[Question]) -> list[list[JobResult]]:
    """Run every harness in `codes` on the same questions, all in one pool batch; results per code."""
    jobs = [job for code in codes for job in make_jobs(task, code, questions)]
    if not jobs:
        return [[] for _ in codes]
    announce(pool, task, questions)
    results = pool.run(jobs, scorer=make_scorer(task, questions))
    n = len(questions)
    return [results[i * n : (i + 1) * n] for i in range(len(codes))]
