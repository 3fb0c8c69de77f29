"""Revision-state pools for GRPO: which (task, harness, feedback round) the proposer revises at a step.

Three modes (`StatesSpec.mode`):
- `seed`: every state revises its task's seed harness (single-step RL, the paper's default).
- `offline` (the paper's Reasoning Gym multistep RL): training runs in phases of `refresh_every`
  steps. At the start of each phase the current proposer runs `rounds` revision rounds per task
  (`proposals` candidates a round, `BestOfG`), and the harnesses it reaches join the pool beside the
  seeds. Refresh runs are stored as adaptation runs, so a resumed run reuses them.
- `online` (the paper's QA multistep RL): each prompt slot is a live revision chain. After a step, the
  slot's best candidate (by reward, `BestOfG`) becomes the harness it revises next; a chain restarts
  from the seed of another task after `max_depth` revisions. Chains are saved after every step, one
  file per slot, by the process that owns the slot.

A state is (task, harness, feedback round): its report comes from running the harness on that round's
fresh feedback questions. `state_rounds` feedback rounds per harness make seed-harness states distinct
prompts (the report differs); in `seed` and `offline` modes the slots of successive steps walk
through pool members, then rounds, and in `online` mode each (step, slot) reads the next round, so a
chain restarted from a seed does not repeat the seed's first state. A state's index decides
everything about it, so reruns draw the same states.

With the prompt's history on (`prompt.history`), every pool member carries the history that led to
it, so a GRPO prompt shows what the proposer would see at that point of a test-time run: an offline
member, the candidates of its refresh run up to the round that reached it; an online chain, the
candidates of its earlier steps (scored on other scoring windows, so without per-question changes).
Histories are saved with the pool and the chains, so a resumed run shows the same ones.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Literal, Sequence

from hljax.config import FLAT
from hljax.generate.types import Generator, Sampling, SamplingOverride
from hljax.harness.history import HistoryEntry, make_entry
from hljax.harness.prompts import PromptConfig
from hljax.loop import records as rec
from hljax.loop import rewards as rw
from hljax.loop.adapt import AdaptConfig, describe_failure, run_adaptation
from hljax.loop.history import entries_from_rounds, store_code
from hljax.loop.revision import RevisionState, build_state
from hljax.tasks.base import Task
from sandbox.pool import SandboxPool


@dataclasses.dataclass(frozen=True)
class StatesSpec:
    mode: Literal["seed", "offline", "online"] = "seed"  # Where GRPO's revision states come from (see the class docstring).
    refresh_every: int = 50  # offline: GRPO steps per phase; the pool is rebuilt when a phase starts.
    rounds: int = 2  # offline: revision rounds per task at a refresh.
    proposals: int = 4  # offline: candidates per refresh round.
    scoring_questions: int = 8  # offline: the refresh runs' scoring set.
    # offline: the proposer's sampling at a refresh; None follows grpo's (RunConfig resolves it), so
    # refreshed states are revisions the proposer makes under training's budget.
    refresh: SamplingOverride = dataclasses.field(default=SamplingOverride(), metadata={FLAT: True})
    keep_seeds: bool = True  # offline: seed-harness states stay in the pool.
    max_depth: int = 4  # online: revisions before a chain restarts from a seed.

    def __post_init__(self):
        if self.mode not in ("seed", "offline", "online"):
            raise ValueError(f"states.mode must be seed, offline or online, got {self.mode!r}")
        if min(self.refresh_every, self.rounds, self.proposals, self.scoring_questions, self.max_depth) < 1:
            raise ValueError("states: refresh_every, rounds, proposals, scoring_questions and max_depth must be >= 1")


def state_key(state: RevisionState) -> int:
    """A 48-bit id of a revision state (task, harness, feedback round): exact in a float64, so it
    travels in the per-row statistics that processes gather (for the count of distinct states)."""
    digest = hashlib.sha256(f"{state.task.name}\0{state.round_index}\0{state.harness}".encode()).digest()
    return int.from_bytes(digest[:6], "big")


@dataclasses.dataclass(frozen=True)
class Entry:
    """A pool member: a task (by index) and a harness to revise."""

    task: int
    harness: str
    origin: str  # "seed", or where the proposer produced it ("phase1/rg_gcd/r0c2").
    depth: int = 0  # online: revisions since the chain's seed.
    history: tuple[HistoryEntry, ...] = ()  # The candidates that led here (empty unless the prompt shows history).

    @classmethod
    def from_dict(cls, d: dict) -> Entry:
        return cls(**{**d, "history": tuple(HistoryEntry.from_dict(h) for h in d.get("history", ()))})

    @property
    def harness_id(self) -> str:
        """The id the history gives this member's harness: its last kept candidate, else the seed."""
        return next((h.id for h in reversed(self.history) if h.selected), rec.SEED_ID)


class StatePool:
    """States for GRPO steps. `directory` holds refresh runs and online chains (under run_dir)."""

    def __init__(self, spec: StatesSpec, tasks: Sequence[Task], seed_harness: str, pool: SandboxPool,
                 state_rounds: int, directory: str, seed: int = 0, prompt: PromptConfig = PromptConfig(),
                 enable_thinking: bool = False):
        """`prompt`, `enable_thinking`: how the proposer is prompted at a refresh (the run's own)."""
        self.spec, self.tasks, self.seed_harness, self.pool = spec, list(tasks), seed_harness, pool
        self.state_rounds, self.directory, self.seed = state_rounds, directory, seed
        self.prompt, self.enable_thinking = prompt, enable_thinking
        self.entries: list[Entry] = [Entry(i, seed_harness, "seed") for i in range(len(self.tasks))]
        self.phase = -1
        self.chains: dict[int, Entry] = {}
        self._cache: dict[tuple[int, str, int], RevisionState] = {}

    # ----- building states -----

    def build(self, entry: Entry, round_index: int) -> RevisionState:
        key = (entry.task, entry.harness, round_index)
        if key not in self._cache:  # The report depends on the harness and round only, not on the history.
            self._cache[key] = build_state(self.pool, self.tasks[entry.task], entry.harness, round_index)
        return dataclasses.replace(self._cache[key], history=entry.history)

    def state(self, step: int, slot: int, prompts_per_step: int) -> RevisionState:
        """The state of slot `slot` at GRPO step `step`."""
        index = step * prompts_per_step + slot
        if self.spec.mode == "online":
            return self.build(self.chains[slot], index % self.state_rounds)
        n = len(self.entries)
        return self.build(self.entries[index % n], (index // n) % self.state_rounds)

    # ----- offline: phases -----

    def phase_of(self, grpo_step: int) -> int:
        """`grpo_step` counts from the first GRPO step of the run (0-based)."""
        return grpo_step // self.spec.refresh_every

    def load_phase(self, phase: int) -> list[Entry]:
        """The pool another process built for `phase` (multi-process runs refresh on process 0)."""
        with open(os.path.join(self.directory, f"phase{phase}", "pool.json")) as f:
            self.entries, self.phase = [Entry.from_dict(e) for e in json.load(f)], phase
        return self.entries

    def refresh(self, phase: int, proposer: Generator, progress=None) -> list[Entry]:
        """Rebuild the pool for `phase` with the proposer as it is now; reuses stored runs."""
        unset = [k for k, v in dataclasses.asdict(self.spec.refresh).items() if v is None]
        if unset:
            raise ValueError(f"states.{unset} unset: a run resolves them to grpo's sampling (RunConfig)")
        cfg = AdaptConfig(rounds=self.spec.rounds, proposals=self.spec.proposals, policy="best_of_g",
                          scoring_questions=self.spec.scoring_questions,
                          sampling=Sampling(**dataclasses.asdict(self.spec.refresh)))
        entries = [Entry(i, self.seed_harness, "seed") for i in range(len(self.tasks))] if self.spec.keep_seeds else []
        seen = {(e.task, e.harness) for e in entries}
        for i, task in enumerate(self.tasks):
            name = task.name.replace("/", "_")
            store = rec.RunStore(os.path.join(self.directory, f"phase{phase}", name))
            rounds = run_adaptation(task, self.seed_harness, proposer, self.pool, cfg, store, seed=self.seed,
                                    run_index=phase, prompt=self.prompt, enable_thinking=self.enable_thinking)
            for k, r in enumerate(rounds):
                if r.selected != rec.SEED_ID and (i, code := store.harness(r.selected)) not in seen:
                    seen.add((i, code))
                    # What a test-time run's next round would show: the candidates of rounds 0..k.
                    history = entries_from_rounds(rounds[: k + 1], store_code(store), self.prompt.history) \
                        if self.prompt.history.enabled else ()
                    entries.append(Entry(i, code, f"phase{phase}/{name}/{r.selected}", history=history))
            if progress is not None:
                progress(task.name)
        if not entries:  # No seeds kept and the proposer produced nothing: nothing to train on.
            raise RuntimeError(f"states refresh for phase {phase}: the proposer produced no valid harness and "
                               "states.keep_seeds is False")
        self.entries, self.phase = entries, phase
        path = os.path.join(self.directory, f"phase{phase}", "pool.json")
        with open(path + ".tmp", "w") as f:
            json.dump([dataclasses.asdict(e) for e in entries], f, indent=1)
        os.replace(path + ".tmp", path)
        return entries

    # ----- online: chains -----

    def start_chains(self, prompts_per_step: int) -> None:
        n = len(self.tasks)
        self.chains = {slot: Entry(slot % n, self.seed_harness, "seed") for slot in range(prompts_per_step)}

    def tried(self, slot: int, cands: Sequence, outcomes: Sequence[rw.Outcome], chosen: int | None
              ) -> tuple[HistoryEntry, ...]:
        """Chain `slot`'s candidates of this step (`cands`: `revision.candidate` results, `chosen`: the
        index advanced to, None: none) as history entries; () unless the prompt shows history. Ids
        are "r{depth}c{index}", the chain's depth standing for a test-time run's round."""
        if not self.prompt.history.enabled:
            return ()
        entry = self.chains[slot]
        out = []
        for j, (c, o) in enumerate(zip(cands, outcomes)):
            code = c.code if rw.failure_kind(c) is None else None
            out.append(make_entry(
                id=rec.candidate_id(entry.depth, j), parent=entry.harness_id, round=entry.depth, kind=o.kind,
                has_code=code is not None, score=o.score, scores=(), parent_score=None, parent_scores=(),
                detail="" if code is not None else describe_failure(c), parent_code=entry.harness, code=code,
                selected=j == chosen, context=self.prompt.history.context_lines))
        return tuple(out)

    def advance(self, step: int, slot: int, best_code: str | None, best_id: str,
                tried: Sequence[HistoryEntry] = ()) -> Entry:
        """After `step`, chain `slot` moves to its best candidate (`best_code`, None if no candidate gave
        a harness: the chain stays), or restarts from the next task's seed at `max_depth`. `tried`:
        the step's candidates (`tried`), appended to the chain's history."""
        entry = self.chains[slot]
        depth = entry.depth + 1
        history = entry.history + tuple(tried)
        if depth >= self.spec.max_depth:
            nxt = Entry((entry.task + len(self.chains)) % len(self.tasks), self.seed_harness, "seed")
        elif best_code is None:
            nxt = dataclasses.replace(entry, depth=depth, history=history)
        else:
            nxt = Entry(entry.task, best_code, f"step{step}/slot{slot}/{best_id}", depth, history)
        self.chains[slot] = nxt
        return nxt

    def _chain_path(self, step: int, slot: int) -> str:
        # One file per slot: with several processes each writes the slots it owns.
        return os.path.join(self.directory, "online", f"after_step{step}", f"slot{slot}.json")

    def save_chains(self, step: int, slots: Sequence[int]) -> None:
        for slot in slots:
            path = self._chain_path(step, slot)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path + ".tmp", "w") as f:
                json.dump(dataclasses.asdict(self.chains[slot]), f)
            os.replace(path + ".tmp", path)

    def load_chains(self, step: int, slots: Sequence[int]) -> None:
        """Chains `slots` as they were after `step` (a resumed run continues from its checkpoint's step)."""
        for slot in slots:
            path = self._chain_path(step, slot)
            if not os.path.exists(path):
                raise FileNotFoundError(f"{path}: the online revision chain of slot {slot} after step {step} is "
                                        "missing, so this run cannot resume it")
            with open(path) as f:
                self.chains[slot] = Entry.from_dict(json.load(f))

    def proposer_made(self) -> list[Entry]:
        """Pool members the proposer produced (not seeds)."""
        members = list(self.chains.values()) if self.spec.mode == "online" else self.entries
        return [e for e in members if e.origin != "seed"]
