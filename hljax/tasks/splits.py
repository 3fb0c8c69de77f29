"""Disjoint, reproducible feedback / scoring / eval question sets, derived from hashed question ids.

A question's split is a pure function of (split seed, question id, shares): the id is hashed to a
point u in [0, 1) and the hash space is cut into three ranges, one per split. So the splits are
disjoint by construction, the same seed gives the same splits, and the configured sizes play no
part in membership: a size only says how many of its split's questions (in stream order) are
taken, and changing it cannot move a question into or out of another split.

Ids hash the question's content (or a dataset's own id), so a generator that repeats a question
repeats its id too; the repeat falls in the same split and is skipped there.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Iterable, Iterator

from hljax.tasks.base import SPLITS, Question, Split


def question_id(namespace: str, key: str) -> str:
    """A stable id for the question `key` (its text, or a dataset's own id) of task `namespace`."""
    return hashlib.blake2b(f"{namespace}\x1f{key}".encode(), digest_size=12).hexdigest()


def unit_hash(seed: int, qid: str, purpose: str) -> float:
    """A uniform point in [0, 1) for (seed, qid, purpose); independent across purposes."""
    digest = hashlib.blake2b(f"{purpose}\x1f{seed}\x1f{qid}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


@dataclasses.dataclass(frozen=True)
class SplitConfig:
    """How a task's questions are divided. Sizes never change membership (see module docstring)."""

    seed: int = 0  # Split seed: same seed and ids -> same splits.
    feedback_size: int = 16  # Questions in one execution report (one revision round).
    scoring_size: int = 32  # Questions every candidate harness is scored on.
    eval_size: int = 64  # Held-out questions for evaluation.
    # Fractions of the id-hash space owned by (feedback, scoring, eval). Changing them DOES move
    # questions between splits; they are fixed per experiment, unlike the sizes.
    shares: tuple[float, float, float] = (1 / 3, 1 / 3, 1 / 3)

    def __post_init__(self):
        for name in ("feedback_size", "scoring_size", "eval_size"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if len(self.shares) != 3 or min(self.shares) <= 0 or abs(sum(self.shares) - 1.0) > 1e-9:
            raise ValueError(f"shares must be 3 positive fractions summing to 1, got {self.shares}")

    def size(self, split: Split) -> int:
        return {"feedback": self.feedback_size, "scoring": self.scoring_size, "eval": self.eval_size}[split]

    def split_of(self, qid: str) -> Split:
        """The split question `qid` belongs to: the hash-space range its point falls in."""
        u = unit_hash(self.seed, qid, "split")
        feedback, scoring, _ = self.shares
        if u < feedback:
            return "feedback"
        return "scoring" if u < feedback + scoring else "eval"


class SplitExhausted(ValueError):
    """A split has fewer distinct questions than asked for."""


def hash_ordered(questions: Iterable[Question], seed: int) -> list[Question]:
    """A finite question set in a seeded order that does not depend on the file's order."""
    return sorted(questions, key=lambda q: (unit_hash(seed, q.qid, "order"), q.qid))


class QuestionSplits:
    """Lazily splits a question stream (finite or very long) into its three disjoint splits.

    Questions are drawn from the stream only as far as needed and kept, so repeated requests are
    cheap and return the same questions. Within a split, order is stream order.
    """

    def __init__(self, stream: Iterable[Question], config: SplitConfig, source: str):
        self.config = config
        self._source = source  # For error messages, e.g. "rg/gcd".
        self._stream: Iterator[Question] = iter(stream)
        self._drawn = 0
        self._exhausted = False
        self._seen: set[str] = set()
        self._by_split: dict[Split, list[Question]] = {s: [] for s in SPLITS}

    def take(self, split: Split, n: int, start: int = 0) -> list[Question]:
        """Questions [start, start + n) of `split`; SplitExhausted if the stream has fewer."""
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; valid: {SPLITS}")
        if n < 0 or start < 0:
            raise ValueError(f"n and start must be >= 0, got n={n}, start={start}")
        have = self._by_split[split]
        while len(have) < start + n and not self._exhausted:
            self._draw()
        if len(have) < start + n:
            raise SplitExhausted(
                f"{self._source}: asked for {split} questions [{start}, {start + n}) but the source has only "
                f"{len(have)} distinct {split} questions (after {self._drawn} drawn)"
            )
        return have[start : start + n]

    def questions(self, split: Split) -> list[Question]:
        """The split's configured number of questions."""
        return self.take(split, self.config.size(split))

    def feedback_round(self, round_index: int) -> list[Question]:
        """Round r's feedback window: fresh questions each round, never scoring or eval ones."""
        n = self.config.feedback_size
        return self.take("feedback", n, start=round_index * n)

    def _draw(self) -> None:
        q = next(self._stream, None)
        if q is None:
            self._exhausted = True
            return
        self._drawn += 1
        if q.qid not in self._seen:
            self._seen.add(q.qid)
            self._by_split[self.config.split_of(q.qid)].append(q)


class SplitQuestions:
    """The question-serving part of the Task protocol, for tasks whose questions sit in
    `self._splits` (a QuestionSplits)."""

    _splits: QuestionSplits

    def questions(self, split: Split) -> Iterator[Question]:
        return iter(self._splits.questions(split))

    def feedback_round(self, round_index: int) -> list[Question]:
        return self._splits.feedback_round(round_index)

    def take(self, split: Split, n: int, start: int = 0) -> list[Question]:
        """Any window of a split, e.g. more evaluation questions than configured."""
        return self._splits.take(split, n, start)
