"""Revision-state pools for multistep RL, with a scripted proposer and the real sandbox."""

import json
import os

import pytest

from hljax.generate.types import Completion
from hljax.harness import seeds
from hljax.generate.types import SamplingOverride
from hljax.rl.states import StatePool, StatesSpec, state_key
from hljax.tasks.reasoning_gym import ReasoningGymTask, RGTaskConfig
from hljax.tasks.suite import split_config
from sandbox.config import SandboxConfig
from sandbox.pool import SandboxPool
from tests._sandbox_fakes import EchoGenerator
from sandbox.isolation import bwrap_path as _bwrap_path

pytestmark = pytest.mark.skipif(_bwrap_path() is None, reason="bwrap not installed (Debian package bubblewrap)")

SEED = seeds.load("reasoning")
SEED_LINE = "    return solver.generate(question).strip()"


def block(search, replace):
    return f"<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE\n"


class Proposer:
    """Edits the seed line when present (a valid edit), else proposes an unparseable reply."""

    def __init__(self):
        self.calls = 0
        self.seen, self.thinking = [], set()

    def chat(self, conversations, sampling, *, n=1, return_logprobs=False, enable_thinking=False):
        self.calls += 1
        self.seen.append(sampling)
        self.thinking.add(enable_thinking)
        prompt = conversations[0][-1]["content"]
        text = block(SEED_LINE, "    return solver.generate(question + ' Think.').strip()") \
            if SEED_LINE in prompt else "nothing"
        return [[Completion(text, (1,), None, "stop", 1, "v") for _ in range(n)]]


@pytest.fixture(scope="module")
def setup():
    tasks = [ReasoningGymTask(RGTaskConfig(family=f, formats=("bare",), pool_size=400,
                                           splits=split_config(2, 6, 6, seed=0))) for f in ("gcd", "lcm")]
    with SandboxPool(SandboxConfig(workers=1, slots_per_worker=4), EchoGenerator()) as pool:
        yield tasks, pool


def test_offline_refresh_adds_proposer_harnesses_and_is_reused(setup, tmp_path):
    tasks, pool = setup
    spec = StatesSpec(mode="offline", refresh_every=3, rounds=2, proposals=2, scoring_questions=3,
                      refresh=SamplingOverride(max_new_tokens=64, temperature=0.5, top_p=0.9, top_k=7))
    states = StatePool(spec, tasks, SEED, pool, state_rounds=2, directory=str(tmp_path), enable_thinking=True)
    proposer = Proposer()
    entries = states.refresh(0, proposer)
    # The refresh samples with the spec's settings (a run's: grpo's) and the proposer's chat template.
    sp = proposer.seen[0]
    assert (sp.max_new_tokens, sp.temperature, sp.top_p, sp.top_k, proposer.thinking) == (64, 0.5, 0.9, 7, {True})
    made = states.proposer_made()
    # Per task: round 0's valid edit is advanced to (BestOfG); round 1 revises it and finds no seed line.
    assert len(made) == 2 and {e.task for e in made} == {0, 1}
    assert all("' Think.'" in e.harness for e in made)
    assert [e.origin for e in entries[:2]] == ["seed", "seed"]
    assert json.load(open(os.path.join(tmp_path, "phase0", "pool.json")))[2]["origin"].startswith("phase0/")
    assert StatePool(spec, tasks, SEED, pool, 2, str(tmp_path)).load_phase(0) == entries  # Other processes.
    # States cycle over the pool: 4 entries, 2 prompts per step.
    s = [states.state(step, slot, 2) for step in range(2) for slot in range(2)]
    assert [x.harness for x in s] == [e.harness for e in entries]
    calls = proposer.calls
    again = StatePool(spec, tasks, SEED, pool, 2, str(tmp_path)).refresh(0, proposer)
    assert again == entries and proposer.calls == calls  # A resumed run reuses the stored refresh.
    assert states.phase_of(0) == 0 and states.phase_of(3) == 1
    with pytest.raises(ValueError, match="unset"):  # A bare spec: a run resolves these from grpo.
        StatePool(StatesSpec(mode="offline"), tasks, SEED, pool, 2, str(tmp_path / "bare")).refresh(0, proposer)


def test_online_chains_advance_stay_restart_and_resume(setup, tmp_path):
    tasks, pool = setup
    spec = StatesSpec(mode="online", max_depth=2)
    states = StatePool(spec, tasks, SEED, pool, state_rounds=4, directory=str(tmp_path))
    states.start_chains(3)
    assert [states.chains[k].task for k in range(3)] == [0, 1, 0]
    first = states.state(0, 0, 3)
    assert first.harness == SEED and first.round_index == 0
    better = SEED.replace("strip()", "strip().lower()")
    states.advance(0, 0, better, "c1")
    states.advance(0, 1, None, "")  # No valid candidate: the chain stays, one revision deeper.
    states.advance(0, 2, better, "c3")
    states.save_chains(0, [0, 1, 2])
    # Step 1, slot 0 of 3: state index 3, so feedback round 3 of 4 (fresh questions, whatever the depth).
    assert states.state(1, 0, 3).harness == better and states.state(1, 0, 3).round_index == 3
    assert states.chains[1].harness == SEED and states.chains[1].depth == 1
    assert len(states.proposer_made()) == 2
    states.advance(1, 0, better + "\n", "c2")  # Depth 2 = max_depth: restart on the next task's seed.
    assert states.chains[0].harness == SEED and states.chains[0].task == (0 + 3) % 2 and states.chains[0].depth == 0

    resumed = StatePool(spec, tasks, SEED, pool, 4, str(tmp_path))
    resumed.load_chains(0, [0, 1])
    assert resumed.chains[0].harness == better and resumed.chains[1].depth == 1
    with pytest.raises(FileNotFoundError, match="after step 5"):
        resumed.load_chains(5, [0])


def test_state_keys_tell_states_apart(setup, tmp_path):
    """The key of the distinct-states metric: one per (task, harness, feedback round), stable, exact
    in a float64 (the per-row statistics processes gather)."""
    tasks, pool = setup
    states = StatePool(StatesSpec(), tasks, SEED, pool, state_rounds=2, directory=str(tmp_path))
    keys = [state_key(states.state(step, slot, 2)) for step in range(4) for slot in range(2)]
    # 2 tasks x 2 rounds = 4 distinct seed states over 8 slots, each twice, in pool order.
    assert keys[:4] == keys[4:] and len(set(keys)) == 4
    assert all(0 <= k < 2**48 and float(k) == k for k in keys)
    other = StatePool(StatesSpec(), tasks, SEED + "\n", pool, 2, str(tmp_path))
    assert state_key(other.state(0, 0, 2)) not in keys
