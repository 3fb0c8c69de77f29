"""The history the proposer sees in adaptation runs and in multistep RL states, with scripted
proposers and the real sandbox (the echo solver)."""

import json
import os
import re

import pytest
import transformers

from hljax.checkpoint.presets import TOKENIZER_DIR
from hljax.harness import history as hh
from hljax.harness import seeds
from hljax.harness.prompts import PromptConfig
from hljax.loop import records as rec
from hljax.loop.adapt import run_adaptation
from hljax.loop.revision import candidate
from hljax.loop.rewards import Outcome, failure_kind
from hljax.generate.types import SamplingOverride
from hljax.rl.states import StatePool, StatesSpec
from hljax.tasks.reasoning_gym import ReasoningGymTask, RGTaskConfig
from hljax.tasks.suite import split_config
from sandbox.isolation import bwrap_path as _bwrap_path
from tests.test_adapt import CFG, SEED_LINE, ScriptedProposer, block
from tests.test_adapt import pool, task  # noqa: F401 (fixtures: one gcd task, one sandbox worker)
from tests.test_history import apply_unified_diff
from tests.test_states import Proposer as StatesProposer

pytestmark = pytest.mark.skipif(_bwrap_path() is None, reason="bwrap not installed (Debian package bubblewrap)")

SEED = seeds.load("reasoning")
ON = PromptConfig(history=hh.HistoryConfig(mode="last", last=8, max_chars=6000))
TITLE = "## Earlier candidates in this run (oldest first)\n"


class Recording(ScriptedProposer):
    """test_adapt's scripted proposer, keeping the user prompt of every round."""

    def __init__(self, *a):
        super().__init__(*a)
        self.prompts = {}

    def chat(self, conversations, sampling, **kw):
        out = super().chat(conversations, sampling, **kw)
        self.prompts[self.calls[-1]] = conversations[0][-1]["content"]
        return out


def section(prompt: str) -> str:
    return prompt.split(TITLE)[1].split("\n\n## Your answer\n")[0]


def _run(task, pool, directory, prompt, stop_after=None):
    proposer = Recording(task.name, 0, CFG.rounds)
    rounds = run_adaptation(task, SEED, proposer, pool, CFG, rec.RunStore(str(directory)), seed=0, prompt=prompt,
                            stop_after=stop_after)
    return rounds, proposer


def test_a_resumed_run_shows_the_same_history_as_an_uninterrupted_one(task, pool, tmp_path):
    full, p_full = _run(task, pool, tmp_path / "full", ON)
    _, p_cut = _run(task, pool, tmp_path / "cut", ON, stop_after=2)
    resumed, p_resumed = _run(task, pool, tmp_path / "cut", ON)
    assert sorted(p_cut.prompts) == [0, 1] and sorted(p_resumed.prompts) == [2, 3]
    assert {**p_cut.prompts, **p_resumed.prompts} == p_full.prompts  # Every prompt, byte for byte.
    assert [r.history for r in resumed] == [r.history for r in full]

    # What the history says, checked against the scripted outcomes (tests/test_adapt.py's SCRIPT).
    assert section(p_full.prompts[0]) == hh.EMPTY
    h2 = section(p_full.prompts[2])
    assert re.findall(r"^### (\S+)", h2, re.M) == ["r0c0", "r0c1", "r1c0", "r1c1"]
    assert "### r0c0 (round 0, revised seed): invalid, not kept\ninvalid edit (SpanNotFound)" in h2
    assert "### r1c1 (round 1, revised seed): valid, kept\nscore 1.000 vs parent" in h2
    assert "better than its parent on 6 questions, worse on 0" in h2
    # The recorded history is the section the proposer saw; the shown diff rebuilds the kept harness.
    assert [r.history for r in full] == [section(p_full.prompts[t]) for t in range(4)]
    diff = re.search(r"### r1c1 .*?```diff\n(.*?)\n```", h2, re.S).group(1)
    kept = rec.RunStore(str(tmp_path / "full")).harness("r1c1")
    assert apply_unified_diff(SEED.splitlines(), diff) == kept.splitlines()


def test_history_off_leaves_prompts_and_records_as_before(task, pool, tmp_path):
    rounds, p = _run(task, pool, tmp_path / "off", PromptConfig(), stop_after=2)
    assert all(TITLE not in text for text in p.prompts.values())
    assert [r.history for r in rounds] == ["", ""]


# ----- multistep RL states -----


@pytest.fixture(scope="module")
def tasks():
    return [ReasoningGymTask(RGTaskConfig(family=f, formats=("bare",), pool_size=400,
                                          splits=split_config(2, 6, 6, seed=0))) for f in ("gcd", "lcm")]


def test_offline_members_carry_the_history_of_their_refresh_run(tasks, pool, tmp_path):
    spec = StatesSpec(mode="offline", refresh_every=3, rounds=2, proposals=2, scoring_questions=3,
                      refresh=SamplingOverride(max_new_tokens=64, temperature=0.5, top_p=0.9, top_k=7))
    states = StatePool(spec, tasks, SEED, pool, state_rounds=2, directory=str(tmp_path), prompt=ON)
    entries = states.refresh(0, StatesProposer())
    made = states.proposer_made()
    assert len(made) == 2 and all(e.origin.endswith("/r0c0") for e in made)
    for e in made:  # Reached at round 0: the history is round 0's two candidates, r0c0 kept.
        assert [(h.id, h.selected, h.has_code) for h in e.history] == [("r0c0", True, True), ("r0c1", False, True)]
        assert e.harness_id == "r0c0"
        assert apply_unified_diff(SEED.splitlines(), e.history[0].diff) == e.harness.splitlines()
    # The GRPO prompt of a member's state shows that history; a seed member's shows none.
    by_harness = {}
    for step in range(2):
        for slot in range(2):
            s = states.state(step, slot, 2)
            by_harness[s.harness] = s.messages(ON)[-1]["content"]
    assert "### r0c0 (round 0, revised seed): valid, kept" in by_harness[made[0].harness]
    assert section(by_harness[SEED]) == hh.EMPTY
    # Another process (or a resumed run) reads the same histories from pool.json.
    assert StatePool(spec, tasks, SEED, pool, 2, str(tmp_path), prompt=ON).load_phase(0) == entries
    # History off: members carry none (the pool file stays as it was, bar an empty list).
    off = StatePool(spec, tasks, SEED, pool, 2, str(tmp_path / "off")).refresh(0, StatesProposer())
    assert all(e.history == () for e in off)


def _outcomes(cands):
    return [Outcome("ran", 0.5, 1.0) if failure_kind(c) is None else Outcome(failure_kind(c), 0.0, 0.0) for c in cands]


def test_online_chains_grow_their_history_and_resume_it(tasks, pool, tmp_path):
    spec = StatesSpec(mode="online", max_depth=3)
    states = StatePool(spec, tasks, SEED, pool, state_rounds=4, directory=str(tmp_path), prompt=ON)
    states.start_chains(2)
    better = block(SEED_LINE, "    return solver.generate(question + ' Think.').strip()")
    cands = [candidate(SEED, "nothing"), candidate(SEED, better)]
    tried = states.tried(0, cands, _outcomes(cands), 1)
    assert [(h.id, h.parent, h.has_code, h.selected) for h in tried] == [("r0c0", "seed", False, False),
                                                                          ("r0c1", "seed", True, True)]
    states.advance(0, 0, cands[1].code, "c1", tried)
    stay = [candidate(SEED, "nothing")]
    states.advance(0, 1, None, "cparent", states.tried(1, stay, _outcomes(stay), None))
    states.save_chains(0, [0, 1])
    prompt = states.state(1, 0, 2).messages(ON)[-1]["content"]
    assert "### r0c1 (round 0, revised seed): valid, kept\nscore 0.500" in section(prompt)
    assert apply_unified_diff(SEED.splitlines(), tried[1].diff) == cands[1].code.splitlines()
    # The next step's candidates revise r0c1, and are numbered by depth.
    nxt = [candidate(cands[1].code, "nothing")]
    assert states.tried(0, nxt, _outcomes(nxt), None)[0].parent == "r0c1"
    assert states.tried(0, nxt, _outcomes(nxt), None)[0].id == "r1c0"
    assert states.chains[1].history[0].id == "r0c0" and states.chains[1].depth == 1
    # Resumed from the saved chains: the same histories, so the same prompts.
    resumed = StatePool(spec, tasks, SEED, pool, 4, str(tmp_path), prompt=ON)
    resumed.start_chains(2)
    resumed.load_chains(0, [0, 1])
    assert resumed.chains == states.chains
    assert resumed.state(1, 0, 2).messages(ON) == states.state(1, 0, 2).messages(ON)
    with open(os.path.join(tmp_path, "online", "after_step0", "slot0.json")) as f:
        assert len(json.load(f)["history"]) == 2
    # A chain that restarts from a seed starts with no history.
    states.advance(1, 0, cands[1].code, "c0", ())
    states.advance(2, 0, cands[1].code, "c0", ())
    assert states.chains[0].origin == "seed" and states.chains[0].history == ()


class TokenizedRecording(Recording):
    """Recording, with the bundled tokenizer a served proposer carries (token budgets count with it)."""

    def __init__(self, *a):
        super().__init__(*a)
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(TOKENIZER_DIR)


def test_token_budgets_on_history_and_report_keep_records_equal_to_the_prompt(task, pool, tmp_path):
    # The budgets are counted independently here, with the same tokenizer as the proposer's.
    tok = transformers.AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    count = lambda text: len(tok.encode(text, add_special_tokens=False))  # noqa: E731
    budget = PromptConfig(report_max_tokens=200,
                          history=hh.HistoryConfig(mode="last", last=8, max_chars=6000, max_tokens=150))
    proposer = TokenizedRecording(task.name, 0, CFG.rounds)
    rounds = run_adaptation(task, SEED, proposer, pool, CFG, rec.RunStore(str(tmp_path / "tok")), seed=0,
                            prompt=budget)
    _, unbudgeted = _run(task, pool, tmp_path / "chars", ON)
    for t, r in enumerate(rounds):
        prompt = proposer.prompts[t]
        shown = prompt.split("## Execution report of the current harness on feedback questions\n")[1].split(
            "\n\n## Earlier candidates")[0]
        assert r.report == shown and count(shown) <= 200
        assert r.history == section(prompt) and count(r.history) <= 150
    # The budget bites: the last round's history shows fewer candidates than under the characters budget.
    ids = lambda text: re.findall(r"^### (\S+)", text, re.M)  # noqa: E731
    assert 0 < len(ids(rounds[-1].history)) < len(ids(section(unbudgeted.prompts[CFG.rounds - 1])))
    assert "omitted)" in rounds[-1].history
