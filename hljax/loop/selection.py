"""Selection policies: which harness a revision round carries forward.

A policy sees the harness it revised (`current`), this round's candidates and every harness scored so
far (`archive`, for policies that keep more than one), all on the same scoring questions, and
returns the next harness and the set it keeps. Policies are pure: the same inputs give the same
choice, which is what lets an interrupted run resume identically.

- `KeepIfBetter` (the paper's Reasoning Gym rule, G=1): keep the best candidate only if its score is
  strictly above the current harness's; otherwise stay.
- `BestOfG` (the paper's QA rule): advance to the best candidate even if it is worse than its parent.
  Invalid candidates score 0, and so does every question a harness crashes on. A candidate without
  code (the edit did not apply) can never be advanced to, so a round of only invalid edits stays
  on the current harness.
- `Pareto` (our addition, after GEPA): keep the front of harnesses that are best on at least one
  scoring question; the next parent is drawn from the front in proportion to how many questions
  it is best on, by a seeded draw.

Ties go to the earlier candidate (lower index), and between equal scores a harness that ran cleanly
beats one that crashed. Candidates flagged for reward hacking are never selected.
"""

from __future__ import annotations

import dataclasses
import random
from typing import TYPE_CHECKING, Literal, Protocol, Sequence

if TYPE_CHECKING:
    from hljax.loop.rewards import OutcomeKind

PolicyName = Literal["keep_if_better", "best_of_g", "pareto"]


@dataclasses.dataclass(frozen=True)
class Scored:
    """A harness and its results on the run's scoring questions."""

    id: str
    score: float  # Mean scoring-set score; questions the harness crashed on count 0.
    scores: tuple[float, ...]  # Per scoring question; empty when the edit was invalid.
    kind: OutcomeKind | Literal["seed"]  # "seed": the seed harness, which no proposal produced.
    has_code: bool

    @property
    def selectable(self) -> bool:
        """A harness that exists and whose scores mean something: not an infrastructure failure, and
        not flagged for reward hacking (a constant answer, reaching for references)."""
        return self.has_code and self.kind != "infra_error" and not self.kind.startswith("flagged:")

    @property
    def ran(self) -> bool:
        return self.kind in ("ran", "seed")

    @property
    def effective_score(self) -> float:
        """What selection compares: 0 unless the harness is selectable."""
        return self.score if self.selectable else 0.0


@dataclasses.dataclass(frozen=True)
class Selection:
    selected: str
    front: tuple[str, ...]


class Policy(Protocol):
    def select(self, current: Scored, candidates: Sequence[Scored], archive: Sequence[Scored],
               round_index: int) -> Selection: ...


def _best(candidates: Sequence[Scored]) -> Scored | None:
    """The selectable candidate with the highest effective score; ties by ran-before-crashed, then order."""
    selectable = [c for c in candidates if c.selectable]
    if not selectable:
        return None
    return max(enumerate(selectable), key=lambda ic: (ic[1].effective_score, ic[1].ran, -ic[0]))[1]


@dataclasses.dataclass(frozen=True)
class KeepIfBetter:
    def select(self, current, candidates, archive, round_index) -> Selection:
        best = _best(candidates)
        if best is not None and best.effective_score > current.effective_score:
            return Selection(best.id, (best.id,))
        return Selection(current.id, (current.id,))


@dataclasses.dataclass(frozen=True)
class BestOfG:
    def select(self, current, candidates, archive, round_index) -> Selection:
        best = _best(candidates)
        chosen = current.id if best is None else best.id
        return Selection(chosen, (chosen,))


@dataclasses.dataclass(frozen=True)
class Pareto:
    seed: int = 0

    def select(self, current, candidates, archive, round_index) -> Selection:
        pool = [h for h in list(archive) + list(candidates) if h.selectable and h.scores]
        pool = list({h.id: h for h in pool}.values())  # The archive may already hold the candidates.
        if not pool:
            return Selection(current.id, (current.id,))
        wins = pareto_wins(pool)
        front = tuple(h.id for h in pool if wins[h.id] > 0)
        if not front:  # Every harness scored 0 everywhere: nothing to prefer, stay.
            return Selection(current.id, (current.id,))
        rng = random.Random(f"pareto/{self.seed}/{round_index}")
        chosen = rng.choices(front, weights=[wins[i] for i in front])[0]
        return Selection(chosen, front)


def pareto_wins(pool: Sequence[Scored]) -> dict[str, int]:
    """For each harness, on how many questions it reaches the best score (> 0) of the pool.

    A harness dominated on every question by one other harness gets no wins, as in GEPA's front.
    """
    n = len(pool[0].scores)
    if any(len(h.scores) != n for h in pool):
        raise ValueError("Pareto selection needs every harness scored on the same questions")
    wins = {h.id: 0 for h in pool}
    for q in range(n):
        top = max(h.scores[q] for h in pool)
        if top <= 0:
            continue
        leaders = [h for h in pool if h.scores[q] == top]
        for h in leaders:
            if not any(_dominates(o, h) for o in leaders if o is not h):
                wins[h.id] += 1
    return wins


def _dominates(a: Scored, b: Scored) -> bool:
    return all(x >= y for x, y in zip(a.scores, b.scores)) and any(x > y for x, y in zip(a.scores, b.scores))


def make_policy(name: PolicyName, seed: int = 0) -> Policy:
    if name == "keep_if_better":
        return KeepIfBetter()
    if name == "best_of_g":
        return BestOfG()
    if name == "pareto":
        return Pareto(seed)
    raise ValueError(f"unknown selection policy {name!r}; valid: keep_if_better, best_of_g, pareto")
