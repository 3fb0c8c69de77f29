"""Selection policies on scripted candidate scores: the paper's two rules and our Pareto front."""

import collections

import pytest

from hljax.loop.selection import BestOfG, KeepIfBetter, Pareto, Scored, make_policy, pareto_wins


def ran(i, score, scores=()):
    return Scored(i, score, tuple(scores), "ran", True)


def crashed(i, score, scores=()):
    return Scored(i, score, tuple(scores), "crashed", True)


def invalid(i, kind="SpanNotFound"):
    return Scored(i, 0.0, (), kind, False)


SEED = Scored("seed", 0.5, (1.0, 0.0), "seed", True)


# ----- KeepIfBetter: G=1, keep only a strict improvement -----

@pytest.mark.parametrize("cand, expect", [
    (ran("c", 0.75), "c"),  # Better: kept.
    (ran("c", 0.5), "seed"),  # A tie is not an improvement.
    (ran("c", 0.25), "seed"),  # Worse: stay.
    (invalid("c"), "seed"),  # No harness.
    (crashed("c", 0.75), "c"),  # Crashed on some questions (they count 0) yet better on the rest.
    (Scored("c", 0.9, (), "infra_error", True), "seed"),  # Says nothing about the harness.
])
def test_keep_if_better(cand, expect):
    assert KeepIfBetter().select(SEED, [cand], [SEED], 0).selected == expect


def test_keep_if_better_with_several_candidates_takes_the_best_improvement():
    cands = [ran("a", 0.6), ran("b", 0.8), ran("c", 0.8)]
    assert KeepIfBetter().select(SEED, cands, [SEED], 0).selected == "b"  # Tie between b and c: earlier wins.


# ----- BestOfG: advance to the best even when worse -----

def test_best_of_g_advances_even_when_worse_than_parent():
    cands = [ran("a", 0.1), ran("b", 0.3), invalid("c")]
    assert BestOfG().select(SEED, cands, [SEED], 0).selected == "b"


def test_best_of_g_ties_prefer_ran_over_crashed_then_order():
    assert BestOfG().select(SEED, [crashed("a", 0.4), ran("b", 0.4)], [SEED], 0).selected == "b"
    assert BestOfG().select(SEED, [ran("a", 0.4), ran("b", 0.4)], [SEED], 0).selected == "a"


def test_best_of_g_all_invalid_round_stays_on_parent():
    cands = [invalid("a"), invalid("b", "Unparseable"), invalid("c", "NoOp")]
    assert BestOfG().select(SEED, cands, [SEED], 0).selected == "seed"


def test_best_of_g_all_zero_advances_to_a_zero_scoring_harness_that_ran():
    # Invalid candidates score 0 but have no code; the first candidate that ran is the best of G.
    cands = [invalid("a"), crashed("b", 0.0), ran("c", 0.0)]
    assert BestOfG().select(SEED, cands, [SEED], 0).selected == "c"


# ----- Pareto (GEPA-style) -----

def test_pareto_wins_hand_computed():
    # Questions:   q0   q1   q2
    a = ran("a", 0, (1.0, 0.0, 0.0))
    b = ran("b", 0, (1.0, 1.0, 0.0))  # Dominates a; best on q0 (with a) and q1.
    c = ran("c", 0, (0.0, 0.0, 0.5))  # Alone on q2.
    d = ran("d", 0, (0.0, 0.0, 0.0))  # Never best.
    assert pareto_wins([a, b, c, d]) == {"a": 0, "b": 2, "c": 1, "d": 0}


def test_pareto_front_and_seeded_draw():
    archive = [Scored("seed", 1 / 3, (1.0, 0.0, 0.0), "seed", True)]
    cands = [ran("b", 2 / 3, (1.0, 1.0, 0.0)), ran("c", 1 / 6, (0.0, 0.0, 0.5)), invalid("x")]
    picks = collections.Counter(
        Pareto(seed=3).select(archive[0], cands, archive, t).selected for t in range(600))
    sel = Pareto(seed=3).select(archive[0], cands, archive, 0)
    assert set(sel.front) == {"b", "c"}  # seed is dominated by b.
    assert set(picks) == {"b", "c"}
    assert 0.55 < picks["b"] / 600 < 0.78  # Drawn in proportion to wins, 2 : 1.
    # Pure: the same round gives the same draw.
    assert Pareto(seed=3).select(archive[0], cands, archive, 7) == Pareto(seed=3).select(archive[0], cands, archive, 7)


def test_pareto_all_zero_stays():
    zero = [ran("a", 0.0, (0.0, 0.0)), invalid("b")]
    assert Pareto().select(ran("seed", 0.0, (0.0, 0.0)), zero, [], 0).selected == "seed"


def test_make_policy_names():
    assert isinstance(make_policy("keep_if_better"), KeepIfBetter)
    assert isinstance(make_policy("best_of_g"), BestOfG)
    with pytest.raises(ValueError, match="best_of_g"):
        make_policy("best_of_n")


def test_flagged_candidates_are_never_selected():
    flagged = Scored("a", 1.0, (1.0, 1.0), "flagged:constant_answer", True)
    assert BestOfG().select(SEED, [flagged], [SEED], 0).selected == "seed"
    assert KeepIfBetter().select(SEED, [flagged, ran("b", 0.6)], [SEED], 0).selected == "b"
    assert "a" not in Pareto().select(SEED, [flagged], [SEED], 0).front
