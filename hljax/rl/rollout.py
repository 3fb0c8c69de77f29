"""GRPO rollouts: revision states -> G proposals each -> candidates scored in the sandbox -> rewards.

The proposer is reached through the SGLang client, whether the server is a real SGLang server or
our embedded JAX engine behind the same API; new weights reach it as an HF export plus
`/update_weights_from_disk`. The solver is a separate, frozen generator serving the sandbox.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor

import jax.numpy as jnp
import numpy as np
import transformers

from hljax import sharding as shd
from hljax.checkpoint import hf
from hljax.generate.client import SGLangGenerator
from hljax.generate.engine import EngineConfig
from hljax.generate.local import LocalGenerator, render_chat
from hljax.generate.server import Server
from hljax.generate.types import SamplingParams
from hljax.harness import seeds
from hljax.loop.revision import RevisionState, build_state, candidate, score_candidates
from hljax.rl import grpo
from hljax.rl import rewards as rw
from hljax.tasks.suite import SEED_HARNESS, build_tasks
from sandbox.pool import SandboxPool

log = logging.getLogger(__name__)


def derive_seed(*parts) -> int:
    """A sampling seed that depends only on `parts` (run seed, step, index), so reruns repeat."""
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=4).digest(), "little") % 2**31


@dataclasses.dataclass
class RolloutBatch:
    sequences: list[tuple[list[int], list[int]]]  # (prompt ids, completion ids) per proposal, groups contiguous
    sampler_logprobs: list[list[float]]
    advantages: np.ndarray  # [B]
    keep: np.ndarray  # [B] bool: False for groups touched by an infrastructure error
    metrics: dict
    time_generate: float
    time_sandbox: float


class Rollouts:
    def __init__(self, cfg, init_path: str, tokenizer, mesh):
        self.cfg = cfg
        self.tokenizer = tokenizer
        self._server = None
        if cfg.rollout.backend == "embedded_server":
            local = LocalGenerator.from_pretrained(init_path, mesh, EngineConfig(
                max_batch=cfg.rollout.max_batch, max_seq_len=cfg.rollout.max_seq_len), dtype=getattr(jnp, cfg.model.dtype))
            self._server = Server(local, init_path).start()
            url = self._server.url
        else:
            url = cfg.rollout.url
        self.proposer = SGLangGenerator(url, tokenizer)
        self.proposer.wait_until_ready(300)
        self.sync_dir = cfg.rollout.sync_dir or os.path.join(cfg.run_dir, "sync")

        if cfg.solver.backend == "embedded":
            solver_path = cfg.solver.path or init_path
            self.solver = LocalGenerator.from_pretrained(solver_path, shd.make_mesh(cfg.mesh), EngineConfig(
                max_batch=cfg.solver.max_batch, max_seq_len=cfg.solver.max_seq_len))
        else:
            self.solver = SGLangGenerator(cfg.solver.url, transformers.AutoTokenizer.from_pretrained(cfg.solver.path))
        self.pool = SandboxPool(cfg.sandbox, self.solver, cfg.solver.budget)

        self.tasks = build_tasks(cfg.tasks, cfg.seed)
        self.seed_harness = seeds.load(SEED_HARNESS[cfg.tasks.suite])
        self._states: dict[tuple[int, int], RevisionState] = {}

    def close(self) -> None:
        self.pool.close()
        if self._server is not None:
            self._server.stop()

    def sync(self, model, version: str) -> None:
        """Push the trainer's weights to the proposer server."""
        hf.save_hf(model, self.sync_dir, dtype=self.cfg.model.param_dtype)
        self.proposer.update_weights_from_disk(self.sync_dir, weight_version=version)

    def state(self, index: int) -> RevisionState:
        """State `index` of the pool: family index % n_families, feedback round (index // n) % rounds."""
        n = len(self.tasks)
        key = (index % n, (index // n) % self.cfg.grpo.state_rounds)
        if key not in self._states:
            task = self.tasks[key[0]]
            self._states[key] = build_state(self.pool, task, self.seed_harness, key[1])
        return self._states[key]

    def collect(self, step: int) -> RolloutBatch:
        cfg, g = self.cfg, self.cfg.grpo
        t_states = time.perf_counter()
        # A state's report comes from sandbox runs (once per state, then cached): sandbox time.
        states = [self.state(step * g.prompts_per_step + i) for i in range(g.prompts_per_step)]
        conversations = [s.messages(cfg.prompt) for s in states]
        t0 = time.perf_counter()

        def propose(i):
            sp = SamplingParams(max_new_tokens=g.max_new_tokens, temperature=g.temperature, top_p=g.top_p,
                                top_k=g.top_k, seed=derive_seed(cfg.seed, step, i))
            return self.proposer.chat([conversations[i]], sp, n=g.group_size, return_logprobs=True)[0]

        with ThreadPoolExecutor(len(states)) as ex:
            groups = list(ex.map(propose, range(len(states))))
        t1 = time.perf_counter()

        outcomes = []
        window = step % g.scoring_windows
        for state, group in zip(states, groups):
            cands = [candidate(state.harness, c.text) for c in group]
            questions = state.task.take("scoring", g.scoring_questions, start=window * g.scoring_questions)
            valid = [j for j, c in enumerate(cands) if rw.failure_kind(c) is None]
            scored = score_candidates(self.pool, state.task, [cands[j].code for j in valid], questions)
            results = dict(zip(valid, scored))
            outcomes.append([rw.outcome(cfg.reward, c, results.get(j)) for j, c in enumerate(cands)])
        t2 = time.perf_counter()

        flat = [o for group in outcomes for o in group]
        keep = np.array([all(o.reward is not None for o in group) for group in outcomes for _ in group])
        rewards = np.array([o.reward if o.reward is not None else 0.0 for o in flat], np.float32)
        adv = np.asarray(grpo.group_advantages(jnp.asarray(rewards), g.group_size, cfg.loss.std_scaling,
                                               cfg.loss.std_ddof, cfg.loss.adv_eps))
        prompts = [self.tokenizer.encode(render_chat(self.tokenizer, c, enable_thinking=False)) for c in conversations]
        sequences = [(prompts[i], list(c.token_ids)) for i, group in enumerate(groups) for c in group]
        sampler = [list(c.logprobs or ()) for group in groups for c in group]
        return RolloutBatch(sequences, sampler, adv, keep, _metrics(flat, rewards[keep], groups), t1 - t0,
                            (t2 - t1) + (t0 - t_states))


def _metrics(flat: list[rw.Outcome], kept_rewards: np.ndarray, groups) -> dict:
    kinds = collections.Counter(o.kind for o in flat)
    n = len(flat)
    m = {
        "reward/mean": float(kept_rewards.mean()) if len(kept_rewards) else float("nan"),
        "reward/std": float(kept_rewards.std()) if len(kept_rewards) else float("nan"),
        "valid_rate": (kinds["ran"] + kinds["crashed"]) / n,
        "ran_rate": kinds["ran"] / n,
        "infra_error_rate": kinds["infra_error"] / n,
        "score/mean": float(np.mean([o.score for o in flat])),
        "completion_len": float(np.mean([len(c.token_ids) for g in groups for c in g])),
        "truncated_rate": float(np.mean([c.finish_reason == "length" for g in groups for c in g])),
    }
    for kind, count in kinds.items():
        if kind not in ("ran", "crashed", "infra_error"):
            m[f"invalid/{kind}"] = count / n
    return m
