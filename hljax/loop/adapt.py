"""Test-time adaptation: T revision rounds on one task with a frozen proposer and solver.

Each round runs the current harness on the round's fresh feedback questions, renders the report,
asks the proposer for G candidates, scores them on the run's fixed scoring questions and lets the
selection policy pick the next harness. With the prompt's history on, the proposer also sees the
run's earlier candidates, rebuilt each round from the stored records. Every finished round is persisted (`records.RunStore`), and
everything a round draws derives from (seed, task, round), so a run stopped after round k and
started again repeats what an uninterrupted run does from round k + 1 on.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Sequence

import numpy as np

from hljax.config import FLAT
from hljax.generate.types import Completion, Generator, Sampling, SamplingParams
from hljax.harness.prompts import PromptConfig, history_text, report_text, token_counter
from hljax.loop import records as rec
from hljax.loop.history import entries_from_rounds, store_code
from hljax.loop import rewards as rw
from hljax.loop.revision import build_state, candidate, score_candidates
from hljax.loop.selection import PolicyName, Scored, make_policy
from hljax.seeding import derive_seed
from hljax.signals import stop_point
from hljax.tasks.base import Question, Task
from hljax.tasks.jobs import run_harness
from sandbox.pool import SandboxPool
from sandbox.results import JobResult


@dataclasses.dataclass(frozen=True)
class AdaptConfig:
    """Test-time adaptation's settings: the `adapt` block of an evaluation, and a state refresh's."""

    rounds: int = 5  # Revision rounds T.
    proposals: int = 1  # Candidates G proposed per round.
    # Selection policy between rounds (hljax/loop/selection.py).
    policy: PolicyName = "keep_if_better"
    runs: int = 1  # Independent runs per task (different sampling seeds; evaluation).
    scoring_questions: int = 16  # Fixed for the run, so every harness is compared on the same ones.
    # The proposer's sampling:
    sampling: Sampling = dataclasses.field(default=Sampling(max_new_tokens=1024, temperature=0.7),
                                           metadata={FLAT: True})

    def __post_init__(self):
        if self.rounds < 1 or self.proposals < 1 or self.scoring_questions < 1 or self.runs < 1:
            raise ValueError("rounds, proposals, runs and scoring_questions must be >= 1")


def question_scores(results: Sequence[JobResult]) -> tuple[float, ...]:
    return tuple(float(r.score or 0.0) for r in results)


def propose(proposer: Generator, messages, sampling: SamplingParams, n: int,
            enable_thinking: bool = False) -> list[Completion]:
    return proposer.chat([messages], sampling, n=n, enable_thinking=enable_thinking)[0]


def judge(pool: SandboxPool, task: Task, parent_code: str, completions: Sequence[str], questions: Sequence[Question],
          ids: Sequence[str], parent_id: str, reward: rw.RewardConfig):
    """Apply, run and score proposals on `questions`: (CandidateRecord, candidate code or None) each."""
    cands = [candidate(parent_code, text) for text in completions]
    valid = [j for j, c in enumerate(cands) if rw.failure_kind(c) is None]
    scored = dict(zip(valid, score_candidates(pool, task, [cands[j].code for j in valid], questions)))
    out = []
    for j, (c, text) in enumerate(zip(cands, completions)):
        o = rw.outcome(reward, c, scored.get(j), [q.answer for q in questions])
        code = cands[j].code if j in scored else None
        out.append((rec.CandidateRecord(
            id=ids[j], parent=parent_id, completion=text, kind=o.kind, detail="" if code is not None else describe_failure(c),
            score=o.score, scores=question_scores(scored[j]) if j in scored else (), has_code=code is not None),
            code))
    return out


def describe_failure(c) -> str:
    """Why an edit gave no harness, as the proposer would be told."""
    return c.describe() if hasattr(c, "describe") else c.reason


def as_scored(c: rec.CandidateRecord) -> Scored:
    return Scored(c.id, c.score, c.scores, c.kind, c.has_code)


def run_adaptation(
    task: Task,
    seed_code: str,
    proposer: Generator,
    pool: SandboxPool,
    cfg: AdaptConfig,
    store: rec.RunStore,
    *,
    seed: int = 0,
    run_index: int = 0,
    prompt: PromptConfig = PromptConfig(),
    reward: rw.RewardConfig = rw.RewardConfig(),
    stop_after: int | None = None,
    progress=None,
    enable_thinking: bool = False,
) -> list[rec.RoundRecord]:
    """Rounds [len(done), cfg.rounds) of one run, resuming from what `store` holds.

    `stop_after`: stop once this many rounds are recorded (a planned interruption).
    `progress`: called with each finished RoundRecord. `enable_thinking`: the proposer's chat
    template's thinking mode (Qwen3).
    """
    policy = make_policy(cfg.policy, seed=derive_seed(seed, task.name, run_index, "policy"))
    scoring = task.take("scoring", cfg.scoring_questions)
    done = store.rounds()
    if done:
        seed_scored = Scored(rec.SEED_ID, done[0].parent_score, done[0].parent_scores, "seed", True)
        if store.harness(rec.SEED_ID) != seed_code:
            raise ValueError(f"{store.directory} was started from a different seed harness; use a new run_dir")
    else:
        store.put_harness(rec.SEED_ID, seed_code)
        _, results = run_harness(pool, task, seed_code, scoring)
        scores = question_scores(results)
        seed_scored = Scored(rec.SEED_ID, float(np.mean(scores)), scores, "seed", True)
    archive: dict[str, Scored] = {rec.SEED_ID: seed_scored}
    for r in done:
        archive.update({c.id: as_scored(c) for c in r.candidates})
    current = done[-1].selected if done else rec.SEED_ID

    last = cfg.rounds if stop_after is None else min(cfg.rounds, stop_after)
    count = token_counter(prompt, proposer)  # Prompts and records count alike: a record keeps what its prompt showed.
    for t in range(len(done), last):
        stop_point(f"{task.name}: {t} round(s) kept")  # A stop signal ends the run between rounds.
        start = time.perf_counter()
        code = store.harness(current)
        # From the store, not from memory: a resumed run rebuilds exactly what it would have had.
        history = entries_from_rounds(store.rounds(), store_code(store), prompt.history) \
            if prompt.history.enabled else ()
        state = build_state(pool, task, code, t, history)
        sampling = cfg.sampling.params(seed=derive_seed(seed, task.name, run_index, t))
        messages = state.messages(prompt, count)
        completions = propose(proposer, messages, sampling, cfg.proposals, enable_thinking)
        ids = [rec.candidate_id(t, i) for i in range(len(completions))]
        judged = judge(pool, task, code, [c.text for c in completions], scoring, ids, current, reward)
        for c, cand_code in judged:
            if cand_code is not None:
                store.put_harness(c.id, cand_code)
        cands = [as_scored(c) for c, _ in judged]
        choice = policy.select(archive[current], cands, list(archive.values()), t)
        scored = {**archive, **{c.id: c for c in cands}}
        record = rec.RoundRecord(
            task=task.name, round=t, parent=current, parent_score=archive[current].score,
            parent_scores=archive[current].scores, feedback_score=state.report.mean_score,
            report=report_text(state.report, prompt, count), candidates=tuple(c for c, _ in judged),
            selected=choice.selected, front=choice.front, seconds=time.perf_counter() - start,
            feedback_qids=tuple(q.qid for q in task.feedback_round(t)), scoring_qids=tuple(q.qid for q in scoring),
            selected_score=scored[choice.selected].score, history=history_text(history, prompt, count))
        store.append(record)
        archive = scored
        current = choice.selected
        if progress is not None:
            progress(record)
    return store.rounds()
