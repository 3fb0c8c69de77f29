"""What a revision run persists, round by round: enough to resume it, to tabulate it and to draw it.

A run directory holds, per task, `rounds.jsonl` (one `RoundRecord` per finished round, swapped in
whole, so a crash loses at most the round in progress) and `harnesses/<id>.py` (every harness by id).
The seed harness has id "seed"; a candidate is "r{round}c{index}".
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from hljax.loop.rewards import OutcomeKind

SEED_ID = "seed"


def candidate_id(round_index: int, index: int) -> str:
    return f"r{round_index}c{index}"


@dataclasses.dataclass(frozen=True)
class CandidateRecord:
    id: str
    parent: str  # Id of the harness this proposal revised.
    completion: str  # The proposer's raw text (the edit).
    kind: OutcomeKind
    detail: str  # Why an invalid edit failed, in words ("" when valid).
    score: float  # Mean scoring-set score; 0 for invalid or crashing candidates per the selection rules.
    scores: tuple[float, ...]  # Per scoring question, in order (empty when the edit was invalid).
    has_code: bool  # True when harnesses/<id>.py holds the candidate harness.


@dataclasses.dataclass(frozen=True)
class RoundRecord:
    task: str
    round: int  # 0-based.
    parent: str  # The harness revised this round.
    parent_score: float  # Its mean score on this round's scoring questions.
    parent_scores: tuple[float, ...]
    feedback_score: float  # The parent's mean score on this round's feedback questions (the report).
    report: str  # The rendered execution report the proposer saw.
    candidates: tuple[CandidateRecord, ...]
    selected: str  # The harness carried into the next round (may equal `parent`).
    front: tuple[str, ...]  # Harnesses kept by the policy (Pareto front; else just `selected`).
    seconds: float
    feedback_qids: tuple[str, ...] = ()  # The questions behind `report`.
    scoring_qids: tuple[str, ...] = ()  # The questions candidates were scored on.
    scored_on: str = "scoring"  # Which split those are: "scoring", or "eval" in single-revision evaluation.
    selected_score: float | None = None  # The selected harness's score on the same questions.
    history: str = ""  # The rendered history section the proposer saw ("" when the prompt's history is off).

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, d: dict) -> RoundRecord:
        d = dict(d)
        d["candidates"] = tuple(CandidateRecord(**{**c, "scores": tuple(c["scores"])}) for c in d["candidates"])
        d["parent_scores"] = tuple(d["parent_scores"])
        d["front"] = tuple(d["front"])
        for key in ("feedback_qids", "scoring_qids"):
            d[key] = tuple(d.get(key, ()))
        return cls(**d)


class RunStore:
    """One task's records under `directory`."""

    def __init__(self, directory: str):
        self.directory = directory
        self.rounds_path = os.path.join(directory, "rounds.jsonl")
        self.harness_dir = os.path.join(directory, "harnesses")
        os.makedirs(self.harness_dir, exist_ok=True)

    def put_harness(self, harness_id: str, code: str) -> None:
        path = os.path.join(self.harness_dir, f"{harness_id}.py")
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(code)
        os.replace(tmp, path)

    def harness(self, harness_id: str) -> str:
        with open(os.path.join(self.harness_dir, f"{harness_id}.py")) as f:
            return f.read()

    def rounds(self) -> list[RoundRecord]:
        """Finished rounds in order."""
        if not os.path.exists(self.rounds_path):
            return []
        out = []
        with open(self.rounds_path) as f:
            for line in f:
                out.append(RoundRecord.from_dict(json.loads(line)))
        return out

    def append(self, record: RoundRecord) -> None:
        done = self.rounds()
        if done and done[-1].round >= record.round:
            raise ValueError(f"round {record.round} already recorded in {self.rounds_path}")
        tmp = self.rounds_path + ".tmp"  # Rewrite and swap: a crash leaves the old file or the new one.
        with open(tmp, "w") as f:
            f.writelines(r.to_json() + "\n" for r in done + [record])
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.rounds_path)


def read_run(directory: str) -> tuple[str, Sequence[RoundRecord], dict[str, str]]:
    """(seed code, rounds, {id: code}) of one task's run directory: what the HTML report draws."""
    store = RunStore(directory)
    codes = {}
    for name in sorted(os.listdir(store.harness_dir)):
        if name.endswith(".py"):
            codes[name[:-3]] = store.harness(name[:-3])
    return codes.get(SEED_ID, ""), store.rounds(), codes
