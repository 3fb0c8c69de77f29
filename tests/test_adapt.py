"""Test-time adaptation rounds with a scripted proposer, the real sandbox and reasoning-gym's scorer.

The proposer's edits are written by hand so that the expected outcome of every round is known
without running our code: a harness that computes the GCD itself must score 1.0 under
reasoning-gym's scorer, an echoing solver scores about 0, and KeepIfBetter must keep exactly the
edit that improved.
"""

import dataclasses
import os
import signal

import pytest

from hljax.generate.types import Completion
from hljax.harness import seeds
from hljax.loop import records as rec
from hljax.loop.adapt import AdaptConfig, run_adaptation
from hljax.seeding import derive_seed
from hljax.signals import StopSignals, Stopped
from hljax.tasks.reasoning_gym import ReasoningGymTask, RGTaskConfig
from hljax.tasks.suite import split_config
from sandbox.config import SandboxConfig
from sandbox.pool import SandboxPool
from tests._sandbox_fakes import EchoGenerator
from sandbox.isolation import bwrap_path as _bwrap_path

pytestmark = pytest.mark.skipif(_bwrap_path() is None, reason="bwrap not installed (Debian package bubblewrap)")

SEED_LINE = "    return solver.generate(question).strip()"
GOOD_BODY = ('    import math, re\n'
             '    nums = [int(x) for x in re.findall(r"\\d+", question.split("numbers:")[1].split(".")[0])]\n'
             '    return str(math.gcd(*nums))')


def block(search: str, replace: str) -> str:
    return f"<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE\n"


# Two proposals per round, written against the harness the round will revise.
SCRIPT = {
    0: [block("    return solver.generate(question)", "    return ''"),  # Not a whole line: SpanNotFound.
        block(SEED_LINE, "    raise RuntimeError('boom')")],  # Crashes everywhere: score 0, not kept.
    1: [block(SEED_LINE, "    return '1'"),  # One constant answer: flagged, never selected.
        block(SEED_LINE, GOOD_BODY)],  # Computes the GCD: every question right.
    2: [block(SEED_LINE, "    return ''"),  # The seed line is gone from the kept harness: SpanNotFound.
        "no edit blocks at all"],  # Unparseable.
    3: [block("    return str(math.gcd(*nums))", "    return str(math.gcd(*nums) + 1)"),  # Worse: not kept.
        block("    return str(math.gcd(*nums))", "    return str(math.gcd(*nums)) + ' '")],  # Equal: not kept.
}


class ScriptedProposer:
    """A `Generator` that answers round t's prompt with SCRIPT[t], recognising t from the seed."""

    def __init__(self, task_name: str, seed: int, rounds: int):
        self.round_of = {derive_seed(seed, task_name, 0, t): t for t in range(rounds)}
        self.calls = []
        self.thinking = set()

    def chat(self, conversations, sampling, *, n=1, return_logprobs=False, enable_thinking=False):
        t = self.round_of[sampling.seed]
        self.calls.append(t)
        self.thinking.add(enable_thinking)
        assert n == len(SCRIPT[t]) and len(conversations) == 1
        assert "## Execution report" in conversations[0][-1]["content"]
        return [[Completion(text, (1,), None, "stop", 10, "script") for text in SCRIPT[t]]]


@pytest.fixture(scope="module")
def task():
    return ReasoningGymTask(RGTaskConfig(family="gcd", formats=("bare",), pool_size=600,
                                         splits=split_config(2, 8, 8, seed=0)))


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(SandboxConfig(workers=1, slots_per_worker=4), EchoGenerator()) as p:
        yield p


CFG = AdaptConfig(rounds=4, proposals=2, policy="keep_if_better", scoring_questions=6)


def _run(task, pool, directory, stop_after=None, proposer=None):
    proposer = proposer or ScriptedProposer(task.name, 0, CFG.rounds)
    rounds = run_adaptation(task, seeds.load("reasoning"), proposer, pool, CFG, rec.RunStore(directory),
                            seed=0, stop_after=stop_after)
    return rounds, proposer


def _strip(rounds):
    return [dataclasses.replace(r, seconds=0.0) for r in rounds]


def test_keep_if_better_rounds_with_real_scorer(task, pool, tmp_path):
    rounds, _ = _run(task, pool, tmp_path / "run")
    assert [r.round for r in rounds] == [0, 1, 2, 3]
    r0, r1, r2, r3 = rounds
    # The echo solver never answers right (the GCD scorer gives a little credit for near numbers).
    assert r0.parent == "seed" and r0.parent_score < 0.05
    assert [c.kind for c in r0.candidates] == ["SpanNotFound", "crashed"]
    assert "not found" in r0.candidates[0].detail.lower() or "search" in r0.candidates[0].detail.lower()
    assert r0.selected == "seed"
    assert r1.candidates[1].kind == "ran" and r1.candidates[1].scores == (1.0,) * 6  # reasoning-gym's scorer.
    assert r1.candidates[0].kind == "flagged:constant_answer" and r1.candidates[0].score < 1.0
    assert r1.selected == "r1c1" and r1.selected_score == 1.0
    assert [c.kind for c in r2.candidates] == ["SpanNotFound", "Unparseable"] and r2.selected == "r1c1"
    assert r3.parent == "r1c1" and r3.parent_score == 1.0
    assert r3.candidates[0].score < 1.0 and r3.candidates[1].score == 1.0
    assert r3.selected == "r1c1"  # Neither is strictly better.
    store = rec.RunStore(str(tmp_path / "run"))
    assert "math.gcd" in store.harness("r1c1") and not r0.candidates[0].has_code
    # Fresh feedback each round; scoring fixed; the two never meet.
    feedback = [set(r.feedback_qids) for r in rounds]
    assert all(not (a & b) for i, a in enumerate(feedback) for b in feedback[i + 1:])
    assert len({r.scoring_qids for r in rounds}) == 1
    assert not set(rounds[0].scoring_qids) & set().union(*feedback)


def test_interrupted_run_resumes_identically(task, pool, tmp_path):
    full, _ = _run(task, pool, tmp_path / "full")
    first, p1 = _run(task, pool, tmp_path / "cut", stop_after=2)
    assert len(first) == 2 and p1.calls == [0, 1]
    resumed, p2 = _run(task, pool, tmp_path / "cut")
    assert p2.calls == [2, 3]  # Rounds 0-1 were not redone.
    assert _strip(resumed) == _strip(full)


class SignalledProposer(ScriptedProposer):
    """Sends this process SIGTERM while round `at` is proposed, as a scheduler would mid-round."""

    def __init__(self, *args, at: int):
        super().__init__(*args)
        self.at = at

    def chat(self, conversations, sampling, **kwargs):
        out = super().chat(conversations, sampling, **kwargs)
        if self.calls[-1] == self.at:
            os.kill(os.getpid(), signal.SIGTERM)
        return out


def test_a_stop_signal_ends_the_run_after_the_round_under_way(task, pool, tmp_path):
    """SIGTERM in round 1: round 1 finishes and is kept, Stopped comes before round 2; the rerun goes
    on from round 2 and ends where an uninterrupted run does."""
    full, _ = _run(task, pool, tmp_path / "full")
    proposer = SignalledProposer(task.name, 0, CFG.rounds, at=1)
    with StopSignals("stopping after the current round", announce=False):
        with pytest.raises(Stopped, match=r"SIGTERM: .*2 round\(s\) kept") as e:
            _run(task, pool, tmp_path / "cut", proposer=proposer)
    assert e.value.exit_code == 143 and proposer.calls == [0, 1]
    resumed, p2 = _run(task, pool, tmp_path / "cut")
    assert p2.calls == [2, 3]
    assert _strip(resumed) == _strip(full)


def test_the_proposers_thinking_mode_reaches_its_chat_template(task, pool, tmp_path):
    _, off = _run(task, pool, tmp_path / "off", stop_after=1)
    proposer = ScriptedProposer(task.name, 0, CFG.rounds)
    run_adaptation(task, seeds.load("reasoning"), proposer, pool, CFG, rec.RunStore(str(tmp_path / "on")), seed=0,
                   stop_after=1, enable_thinking=True)
    assert (off.thinking, proposer.thinking) == ({False}, {True})


def test_resume_refuses_a_different_seed_harness(task, pool, tmp_path):
    _run(task, pool, tmp_path / "run", stop_after=1)
    with pytest.raises(ValueError, match="different seed harness"):
        run_adaptation(task, "def solve(question, solver):\n    return 'x'\n", ScriptedProposer(task.name, 0, 4),
                       pool, CFG, rec.RunStore(str(tmp_path / "run")))
