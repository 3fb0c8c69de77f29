"""GRPO rollouts: revision states -> G proposals each -> candidates scored in the sandbox -> rewards.

The proposer is reached through the SGLang client, whether the server is a real SGLang server or
our embedded JAX engine behind the same API; new weights reach it as an HF export plus
`/update_weights_from_disk`. The `colocated` backend is our engine in this process without HTTP: it
takes the new weights as arrays (hljax/generate/colocated.py). The solver is a separate, frozen generator serving the sandbox.

Multi-process: each process collects the states ("slots") of its own rows of the batch, with its own
sandbox pool and embedded server (or the shared SGLang servers / router of `rollout.url`), and
returns per-row statistics. `score_groups` turns the statistics of all rows of the step (gathered from
every process) into advantages and metrics, so group and batch statistics never depend on the split.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import time
import typing
from concurrent.futures import ThreadPoolExecutor

import jax.numpy as jnp
import numpy as np

from hljax import distributed as dist
from hljax.checkpoint import hf
from hljax.config import TaskSpec
from hljax.endpoints import Endpoint, GeneratorSpec
from hljax.generate.types import Completion, InMemoryTrainable, TrainableGenerator, render_chat
from hljax.harness.prompts import PromptConfig, token_counter
from hljax.loop import rewards as rw
from hljax.loop.revision import candidate, score_candidates
from hljax.loop.selection import BestOfG, Scored
from hljax.rl.states import StatePool, StatesSpec, state_key
from hljax.rl.config import LossConfig
from hljax.rl.grpo import group_advantages, zero_variance_groups
from hljax.rl.run_config import WRITER
from hljax.seeding import derive_seed
from hljax.tasks.suite import tasks_and_seed_harness
from sandbox.config import SandboxConfig, SolverConfig
from sandbox.pool import SandboxPool

if typing.TYPE_CHECKING:
    from hljax.rl.run_config import GRPOSpec

log = logging.getLogger(__name__)


# Outcome kinds travel as their index here, so per-row statistics cross processes as one float array.
KINDS = rw.OUTCOME_KINDS
# Columns of RolloutBatch.stats; reward is NaN for an infrastructure error (no reward at all); state is
# the revision state's `state_key` (48 bits, exact in float64), for the count of distinct states.
STATS = ("reward", "kind", "score", "completion_len", "truncated", "state") + tuple(f"flag/{f}" for f in rw.FLAGS)
COL = {name: i for i, name in enumerate(STATS)}  # Column index by name: stats[:, COL["reward"]].


@dataclasses.dataclass
class RolloutBatch:
    """This process's rows: the groups of its slots, contiguous, in slot order."""

    sequences: list[tuple[list[int], list[int]]]  # (prompt ids, completion ids) per proposal
    sampler_logprobs: list[list[float]]
    stats: np.ndarray  # [B_local, len(STATS)] float64
    time_generate: float
    time_sandbox: float
    texts: list[str] = dataclasses.field(default_factory=list)  # The proposals, row order (for rollouts.jsonl).
    tasks: list[str] = dataclasses.field(default_factory=list)  # Each row's task name.


def score_groups(stats: np.ndarray, group_size: int, loss_cfg: LossConfig) -> tuple[np.ndarray, np.ndarray, dict]:
    """Statistics of ALL rows of a step ([B, len(STATS)], groups contiguous) -> (advantages [B],
    keep [B] bool, metrics). keep is False for every row of a group touched by an infrastructure error
    and, with loss.zero_variance_groups="drop", of a group whose rewards are all equal; such rows get
    loss mask 0. groups/zero_variance counts the latter (infrastructure-error groups aside) whether or
    not they are dropped; groups/dropped counts the groups with loss mask 0."""
    rewards = stats[:, COL["reward"]]
    infra_rows = np.isnan(rewards)
    infra = infra_rows.reshape(-1, group_size).any(axis=1)  # [B / G]
    filled = np.where(infra_rows, 0.0, rewards).astype(np.float32)
    flat = np.asarray(zero_variance_groups(jnp.asarray(filled), group_size)) & ~infra
    dropped = infra | flat if loss_cfg.zero_variance_groups == "drop" else infra
    keep = (~dropped).repeat(group_size)
    adv = np.asarray(group_advantages(jnp.asarray(filled), group_size, loss_cfg.std_scaling, loss_cfg.std_ddof,
                                      loss_cfg.adv_eps))
    metrics = _metrics(stats, filled[~infra.repeat(group_size)])
    metrics.update({"groups/zero_variance": int(flat.sum()), "groups/dropped": int(dropped.sum())})
    return adv, keep, metrics


class Rollouts:
    """The proposer and solver endpoints, the sandbox pool, the tasks and the state pool of GRPO."""

    def __init__(self, proposer: GeneratorSpec, solver: GeneratorSpec, budget: SolverConfig, *, grpo: GRPOSpec,
                 states: StatesSpec, tasks: TaskSpec, sandbox: SandboxConfig, reward: rw.RewardConfig,
                 prompt: PromptConfig, seed: int, first_step: int, sync_dir: str, sync_dtype: str, states_dir: str,
                 tokenizer, mesh, enable_thinking: bool = False):
        """`proposer`: an embedded_server or sglang endpoint (one URL, a comma-separated list of servers,
        or an sglang-router); `budget`: the solver's in the sandbox; `first_step`: the global step GRPO
        starts at; `sync_dir`: where new weights are exported for the proposer server(s), in
        `sync_dtype`; `tokenizer`: the trainer's (prompts are encoded with it); `mesh`: the devices this
        process's embedded engines run on (its own devices when there are several processes: each
        serves itself); `enable_thinking`: the proposer's chat template (model.enable_thinking)."""
        self.grpo, self.states_spec, self.reward, self.prompt = grpo, states, reward, prompt
        self.enable_thinking = enable_thinking
        self.seed, self.first_step, self.sync_dtype = seed, first_step, sync_dtype
        self.tokenizer = tokenizer
        self._proposer = Endpoint(proposer, mesh, tokenizer, name="proposer")
        self.proposer: TrainableGenerator = self._proposer.generator
        self._embedded = self._proposer.server is not None
        if missing := self.proposer.servers_without_weight_updates():
            self._proposer.close()
            raise ValueError(f"proposer server(s) {missing} have no /update_weights_from_disk, and GRPO pushes new "
                             "weights after every step: use rollout.backend='sglang_jax' for sglang-jax (hljax "
                             "restarts it on each new checkpoint), or serve the proposer with SGLang")
        self.sync_dir = sync_dir
        self.version: str | None = None  # Of the weights last pushed to the proposer (`sync`).
        if self._embedded and dist.process_count() > 1:
            # Each process exports for its own server; one shared folder would be rewritten by all.
            self.sync_dir = f"{self.sync_dir.rstrip(os.sep)}-p{dist.process_index()}"

        self._solver = Endpoint(solver, mesh, name="solver")
        self.solver = self._solver.generator
        self.pool = SandboxPool(sandbox, self.solver, budget)

        self.tasks, self.seed_harness = tasks_and_seed_harness(tasks, seed)
        self.states = StatePool(states, self.tasks, self.seed_harness, self.pool, grpo.state_rounds, states_dir,
                                seed=seed, prompt=prompt, enable_thinking=enable_thinking)

    def close(self) -> None:
        self.pool.close()
        self._solver.close()
        self._proposer.close()

    def sync(self, model, version: str) -> None:
        """Push the trainer's weights to the proposer server(s). `model`'s parameters must be
        addressable here (the trainer passes a gathered copy when there are several processes).

        Embedded servers: every process exports and pushes to its own. External servers are shared:
        process 0 exports once and pushes to all of them, and everyone waits for it, so no process
        samples from the old weights."""
        if isinstance(self.proposer, InMemoryTrainable):  # In this process: each process hands over its own.
            self.proposer.update_weights_from_model(model, weight_version=version)
        else:
            if self._embedded or dist.is_main():
                hf.save_hf(model, self.sync_dir, dtype=self.sync_dtype, writer=WRITER, replace=True)
                self.proposer.update_weights_from_disk(self.sync_dir, weight_version=version)
            if not self._embedded:
                dist.barrier(f"weights-{version}")
        self.version = version

    def prepare(self, step: int, slots: typing.Sequence[int]) -> None:
        """Bring the state pool to `step` (a global step): an offline phase refresh, or the online
        chains as of the previous step (fresh at the first GRPO step, loaded when resuming)."""
        spec, grpo_step = self.states_spec, step - self.first_step
        if spec.mode == "offline":
            phase = self.states.phase_of(grpo_step)
            if phase != self.states.phase:
                # Process 0 runs the refresh with its proposer server; the others read its pool.
                if dist.is_main():
                    log.info("states: refreshing the pool for phase %d with the current proposer", phase)
                    self.states.refresh(phase, self.proposer)
                dist.barrier(f"states-phase{phase}")
                if not dist.is_main():
                    self.states.load_phase(phase)
        elif spec.mode == "online" and not self.states.chains:
            self.states.start_chains(self.grpo.prompts_per_step)
            if grpo_step > 0:
                self.states.load_chains(step - 1, slots)

    def collect(self, step: int, slots: typing.Sequence[int]) -> RolloutBatch:
        """Groups of the step's states `slots` (indices in 0..prompts_per_step-1: this process's
        share). State and sampling seeds depend on the global slot, never on the process."""
        g = self.grpo
        draw = step + g.draw_offset
        t_states = time.perf_counter()
        # A state's report comes from sandbox runs (once per state, then cached): sandbox time.
        self.prepare(step, slots)
        states = [self.states.state(draw, i, g.prompts_per_step) for i in slots]
        count = token_counter(self.prompt, self.proposer)
        conversations = [s.messages(self.prompt, count) for s in states]
        t0 = time.perf_counter()

        def propose(k):
            sp = g.sampling.params(seed=derive_seed(self.seed, draw, slots[k]))
            return self.proposer.chat([conversations[k]], sp, n=g.group_size, return_logprobs=True,
                                      enable_thinking=self.enable_thinking)[0]

        with ThreadPoolExecutor(max(1, len(states))) as ex:
            groups = list(ex.map(propose, range(len(states))))
        if stale := stale_versions(groups, self.version):
            raise RuntimeError(f"step {step}: the proposer sampled with weight version(s) {stale}, but the trainer "
                               f"pushed version {self.version!r}: a proposer server or engine kept its old weights, "
                               "and training on its samples would be off-policy without a record of it")
        t1 = time.perf_counter()

        outcomes = []
        window = draw % g.scoring_windows
        for state, group in zip(states, groups):
            cands = [candidate(state.harness, c.text) for c in group]
            questions = state.task.take("scoring", g.scoring_questions, start=window * g.scoring_questions)
            valid = [j for j, c in enumerate(cands) if rw.failure_kind(c) is None]
            scored = score_candidates(self.pool, state.task, [cands[j].code for j in valid], questions)
            results = dict(zip(valid, scored))
            references = [q.answer for q in questions]
            outcomes.append([rw.outcome(self.reward, c, results.get(j), references) for j, c in enumerate(cands)])
            if self.states_spec.mode == "online":
                self._advance(step, slots[len(outcomes) - 1], cands, outcomes[-1])
        if self.states_spec.mode == "online":
            self.states.save_chains(step, slots)
        t2 = time.perf_counter()

        stats = np.array([_stats_row(o, c, state_key(s)) for s, os_, group in zip(states, outcomes, groups)
                          for o, c in zip(os_, group)], np.float64)
        # The prompt tokens the proposer saw: rendered as the chat call above rendered them.
        prompts = [self.tokenizer.encode(render_chat(self.tokenizer, c, self.enable_thinking)) for c in conversations]
        sequences = [(prompts[i], list(c.token_ids)) for i, group in enumerate(groups) for c in group]
        sampler = [list(c.logprobs or ()) for group in groups for c in group]
        return RolloutBatch(sequences, sampler, stats.reshape(-1, len(STATS)), t1 - t0, (t2 - t1) + (t0 - t_states),
                            texts=[c.text for group in groups for c in group],
                            tasks=[s.task.name for s, group in zip(states, groups) for _ in group])


    def _advance(self, step: int, slot: int, cands, outcomes) -> None:
        """Online chains: the slot moves to its best candidate by reward (BestOfG: even when worse)."""
        scored = [Scored(str(j), o.reward or 0.0, (), o.kind, rw.failure_kind(c) is None)
                  for j, (c, o) in enumerate(zip(cands, outcomes))]
        parent = Scored("parent", 0.0, (), "seed", True)
        chosen = BestOfG().select(parent, scored, [], step).selected
        best = None if chosen == "parent" else cands[int(chosen)].code
        # The chain's history grows by this step's candidates (when the prompt shows history).
        tried = self.states.tried(slot, cands, outcomes, None if chosen == "parent" else int(chosen))
        self.states.advance(step, slot, best, f"c{chosen}", tried)


def stale_versions(groups: typing.Sequence[typing.Sequence[Completion]], expected: str | None) -> list[str]:
    """The weight versions, other than `expected`, that completions report (none when nothing was pushed
    yet; a server that reports no version, "", cannot be checked)."""
    if expected is None:
        return []
    return sorted({c.weight_version for g in groups for c in g if c.weight_version and c.weight_version != expected})


def sample_rows(step: int, rows: np.ndarray, batch: RolloutBatch, advantages: np.ndarray, keep: np.ndarray) -> list[dict]:
    """One rollouts.jsonl row per proposal of this process: what was sampled and what it earned.
    `rows`: the batch rows this process holds; `advantages`, `keep`: of the whole batch."""
    out = []
    for i, r in enumerate(rows):
        st = batch.stats[i]
        reward = st[COL["reward"]]
        out.append({"step": step, "row": int(r), "task": batch.tasks[i], "kind": KINDS[int(st[COL["kind"]])],
                    "state": f"{int(st[COL['state']]):012x}",
                    "score": float(st[COL["score"]]), "reward": None if np.isnan(reward) else float(reward),
                    "advantage": float(advantages[r]) if keep[r] else None, "completion": batch.texts[i]})
    return out


def _stats_row(o: rw.Outcome, c: Completion, state: int) -> list[float]:
    """One proposal's row of RolloutBatch.stats, in STATS order; `state`: its state's state_key."""
    if o.kind not in KINDS:
        raise ValueError(f"outcome kind {o.kind!r} is not one of rewards.OutcomeKind {KINDS}; add it there")
    row = {"reward": np.nan if o.reward is None else o.reward, "kind": KINDS.index(o.kind), "score": o.score,
           "completion_len": len(c.token_ids), "truncated": c.finish_reason == "length", "state": state,
           **{f"flag/{f}": f in o.flags for f in rw.FLAGS}}
    return [float(row[name]) for name in STATS]


def _metrics(stats: np.ndarray, kept_rewards: np.ndarray) -> dict:
    kinds = collections.Counter(KINDS[int(k)] for k in stats[:, COL["kind"]])
    n = len(stats)
    m = {
        "reward/mean": float(kept_rewards.mean()) if len(kept_rewards) else float("nan"),
        "reward/std": float(kept_rewards.std()) if len(kept_rewards) else float("nan"),
        # Flagged candidates are valid edits whose harness was caught reward hacking.
        "valid_rate": (kinds["ran"] + kinds["crashed"] + sum(kinds[k] for k in rw.FLAGGED_KINDS)) / n,
        "ran_rate": kinds["ran"] / n,
        "infra_error_rate": kinds["infra_error"] / n,
        "score/mean": float(stats[:, COL["score"]].mean()),
        "completion_len": float(stats[:, COL["completion_len"]].mean()),
        "truncated_rate": float(stats[:, COL["truncated"]].mean()),
    }
    for f in rw.FLAGS:
        m[f"flag/{f}"] = float(stats[:, COL[f"flag/{f}"]].sum())  # Counts, not rates: each is worth a look.
    # Every kind every step, zeros included: a curve with gaps reads as missing data.
    for kind in KINDS:
        if kind not in rw.RUN_KINDS + rw.FLAGGED_KINDS:
            m[f"invalid/{kind}"] = kinds[kind] / n
    return m
