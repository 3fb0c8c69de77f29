"""The paper's configs as shipped: one solver and one set of revision conditions per setup across
collection, training and evaluation; the multistep configs; prompt diversity; thinking mode. Expected
values are written out here, from the configs' docstrings and docs/reproducing.md."""

import collections

import pytest

from hljax.rl.states import StatePool, StatesSpec
from hljax.tasks.rg_families import RL
from tests.test_configs import NAMES, SCHEMA, _fill_required, _kind, _load


def _resolved(name):
    c = _load(name)
    kind = _kind(c)
    return SCHEMA[kind].from_config(_fill_required(c, kind))


def _suite(cfg) -> str:
    return cfg.tasks.suite


# Every experiment config that talks to a real solver server belongs to the setup of its task suite;
# the schema files do not, nor the tiny and simulated ones (they stand in for the paper on CPU), nor
# rg_sft (SFT runs no solver).
SCHEMA_FILES = {"base", "adapt_base", "collect_base"}
RESOLVED = {name: _resolved(name) for name in NAMES}
PAPER = {name: cfg for name, cfg in RESOLVED.items() if cfg.solver.backend == "sglang" and name not in SCHEMA_FILES}
SETUP_MEMBERS = {
    "reasoning_gym": {"collect_rg", "rg_grpo", "rg_grpo_multistep", "adapt_rg", "eval_rg_single", "eval_rg_multistep",
                      "eval_rg_multistep_history"},
    "multihop_qa": {"qa_grpo", "qa_grpo_online", "adapt_qa", "eval_qa_single", "eval_qa_rounds",
                    "eval_qa_rounds_history"},
}
# The solver regime (configs/setups.py): Qwen's non-thinking sampling, 2,048 tokens (QA: 512), 16 calls.
EXPECTED_SOLVER = {
    "reasoning_gym": dict(temperature=0.7, top_p=0.8, top_k=20, max_new_tokens=2048, max_calls=16, max_tokens=16384),
    "multihop_qa": dict(temperature=0.7, top_p=0.8, top_k=20, max_new_tokens=512, max_calls=16, max_tokens=16384),
}


def test_every_solver_config_is_in_a_setup():
    by_suite = collections.defaultdict(set)
    for name, cfg in PAPER.items():
        by_suite[_suite(cfg)].add(name)
    assert dict(by_suite) == SETUP_MEMBERS


@pytest.mark.parametrize("setup", sorted(SETUP_MEMBERS))
def test_collection_training_and_evaluation_share_one_solver(setup):
    cfgs = {name: PAPER[name] for name in sorted(SETUP_MEMBERS[setup])}
    solvers = {name: cfg.solver for name, cfg in cfgs.items()}
    first = next(iter(solvers.values()))
    assert all(s == first for s in solvers.values()), solvers
    sampling = first.budget.sampling
    got = dict(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
               max_new_tokens=sampling.max_new_tokens, max_calls=first.budget.max_calls,
               max_tokens=first.budget.max_tokens)
    assert got == EXPECTED_SOLVER[setup]
    assert first.budget.enable_thinking is False and first.url == "http://127.0.0.1:30001"
    # What the proposer is shown and how long a harness may run: the same everywhere too.
    conditions = {name: (c.tasks.feedback, c.prompt.report_max_chars, c.sandbox.timeout_s) for name, c in cfgs.items()}
    assert set(conditions.values()) == {(16, 12000, 300.0)}, conditions


def test_the_tiny_configs_keep_their_own_solver():
    """The CPU stand-ins are untouched by the setups: greedy; the simulated solver's configs share one
    block (room for every family's answer, 8 calls for a harness that checks and votes)."""
    expect = {"tiny": (0.0, 256, 8, 8192), "adapt_tiny": (0.0, 256, 8, 8192), "collect_tiny": (0.0, 32, 4, 256)}
    for name, want in expect.items():
        s = _resolved(name).solver
        assert s.backend in ("simulated", "embedded")
        assert (s.budget.sampling.temperature, s.budget.sampling.max_new_tokens, s.budget.max_calls,
                s.budget.max_tokens) == want
    assert _resolved("tiny").solver == _resolved("adapt_tiny").solver


def test_multistep_configs():
    ms = _resolved("rg_grpo_multistep")
    assert ms.mode == "grpo" and ms.model.path == "runs/rg_grpo/export"
    assert (ms.states.mode, ms.states.refresh_every, ms.states.rounds, ms.states.proposals) == ("offline", 50, 4, 4)
    # The refresh samples as the training proposals do: 4,096 tokens at temperature 1, no truncation.
    r = ms.states.refresh
    assert (r.max_new_tokens, r.temperature, r.top_p, r.top_k) == (4096, 1.0, 1.0, -1)
    assert (ms.grpo.sampling.max_new_tokens, ms.grpo.sampling.temperature) == (4096, 1.0)
    online = _load("qa_grpo_online")
    assert online.model.path == ""  # Required: the base model (no SFT).
    cfg = _resolved("qa_grpo_online")
    assert (cfg.mode, cfg.states.mode, cfg.states.max_depth, cfg.tasks.suite) == ("grpo", "online", 10, "multihop_qa")
    # Single-step configs stay single-step.
    assert _resolved("rg_grpo").states.mode == _resolved("qa_grpo").states.mode == "seed"


class _KeyPool(StatePool):
    """The pool's indexing alone: a state is its (task, round) key, nothing is run."""

    def build(self, entry, round_index):
        return entry.task, round_index


@pytest.mark.parametrize("name,tasks,most", [("rg_grpo", len(RL), 4), ("qa_grpo", 1, 4)])
def test_single_step_prompts_repeat_at_most_a_few_times_per_epoch(name, tasks, most):
    """Over the 300 steps of the paper's run, every (task, feedback round) state is revised at most
    `most` times: 5 x 240 = 1,200 states for 4,800 Reasoning Gym slots, 600 for 2,400 QA slots."""
    cfg = _resolved(name)
    g = cfg.grpo
    pool = _KeyPool(cfg.states, [None] * tasks, "seed", None, g.state_rounds, "/nonexistent")
    seen = collections.Counter(pool.state(step, slot, g.prompts_per_step)
                               for step in range(g.steps) for slot in range(g.prompts_per_step))
    assert g.steps == 300
    assert len(seen) == tasks * g.state_rounds == g.steps * g.prompts_per_step // most
    assert max(seen.values()) == most
    # The Reasoning Gym feedback split must hold state_rounds windows: 240 x 16 questions per family.
    if name == "rg_grpo":
        assert (g.state_rounds * cfg.tasks.feedback, cfg.tasks.pool_size) == (3840, 20000)


def test_online_states_read_fresh_feedback_rounds():
    """A restarted chain's seed state is not the same prompt every time: (step, slot) picks the round."""
    pool = _KeyPool(StatesSpec(mode="online", max_depth=2), [None], "seed", None, 600, "/nonexistent")
    pool.start_chains(8)
    keys = [pool.state(step, slot, 8) for step in range(3) for slot in range(8)]
    assert keys == [(0, i) for i in range(24)]


def test_thinking_mode_is_off_and_said_so():
    for name, cfg in RESOLVED.items():
        assert cfg.solver.budget.enable_thinking is False, name
        proposer = getattr(cfg, "model", None) or getattr(cfg, "proposer", None)
        if proposer is not None:
            assert proposer.enable_thinking is False, name
        if hasattr(cfg, "teacher"):
            assert cfg.teacher.enable_thinking is False, name
    for name in set().union(*SETUP_MEMBERS.values()) - {"eval_rg_single", "eval_rg_multistep", "eval_qa_single",
                                                          "eval_qa_rounds", "eval_rg_multistep_history",
                                                          "eval_qa_rounds_history"}:
        doc = __import__(f"configs.{name}", fromlist=["_"]).__doc__
        assert "Thinking mode is off" in " ".join(doc.split()), name
