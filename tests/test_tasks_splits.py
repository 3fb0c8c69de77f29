"""Splits: disjoint by construction, reproducible, and sizes never move questions between splits."""

import collections

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hljax.tasks.base import SPLITS, Question
from hljax.tasks.splits import QuestionSplits, SplitConfig, SplitExhausted, hash_ordered, question_id


PINNED_ID = "3c6345c36c01612dad7589eb"


def stream(n, namespace="t", repeat_every=0):
    """n synthetic questions; with repeat_every=k, every k-th one repeats an earlier question."""
    for i in range(n):
        key = str(i - 1) if repeat_every and i % repeat_every == 0 and i else str(i)
        yield Question(question_id(namespace, key), f"question {key}", f"answer {key}")


def ids(questions):
    return [q.qid for q in questions]


def test_question_id_is_stable_and_namespaced():
    assert question_id("rg/gcd", "What is 2+2?") == question_id("rg/gcd", "What is 2+2?")
    assert question_id("rg/gcd", "What is 2+2?") != question_id("rg/lcm", "What is 2+2?")
    assert len({question_id("x", str(i)) for i in range(10_000)}) == 10_000
    # Pinned: changing the id derivation would silently reshuffle every split of every experiment.
    assert question_id("hotpotqa", "abc") == PINNED_ID
    first = "".join(SplitConfig(seed=0).split_of(question_id("t", str(i)))[0] for i in range(12))
    assert first == "essfefeeesse"


def test_config_validation():
    with pytest.raises(ValueError, match="feedback_size"):
        SplitConfig(feedback_size=-1)
    with pytest.raises(ValueError, match="shares"):
        SplitConfig(shares=(0.5, 0.5, 0.0))
    with pytest.raises(ValueError, match="shares"):
        SplitConfig(shares=(0.5, 0.3, 0.3))


def test_assignment_follows_shares_over_many_ids():
    for shares in [(1 / 3, 1 / 3, 1 / 3), (0.2, 0.3, 0.5)]:
        cfg = SplitConfig(seed=3, shares=shares)
        counts = collections.Counter(cfg.split_of(question_id("t", str(i))) for i in range(30_000))
        for split, share in zip(SPLITS, shares):
            assert abs(counts[split] / 30_000 - share) < 0.015, (split, counts)


def test_splits_are_disjoint_and_sized_over_thousands_of_questions():
    cfg = SplitConfig(seed=1, feedback_size=1500, scoring_size=1500, eval_size=1500)
    splits = QuestionSplits(stream(6000), cfg, "t")
    got = {s: ids(splits.questions(s)) for s in SPLITS}
    for s in SPLITS:
        assert len(got[s]) == cfg.size(s) == len(set(got[s]))
        assert all(cfg.split_of(q) == s for q in got[s])
    assert not set(got["feedback"]) & set(got["scoring"])
    assert not set(got["feedback"]) & set(got["eval"])
    assert not set(got["scoring"]) & set(got["eval"])


def test_same_seed_same_splits_other_seed_other_splits():
    cfg = SplitConfig(seed=5, feedback_size=200, scoring_size=200, eval_size=200)
    a = {s: ids(QuestionSplits(stream(2000), cfg, "t").questions(s)) for s in SPLITS}
    b = {s: ids(QuestionSplits(stream(2000), cfg, "t").questions(s)) for s in SPLITS}
    assert a == b
    other = SplitConfig(seed=6, feedback_size=200, scoring_size=200, eval_size=200)
    c = {s: ids(QuestionSplits(stream(2000), other, "t").questions(s)) for s in SPLITS}
    assert a["eval"] != c["eval"]


def test_changing_one_size_moves_nothing_between_the_others():
    small = SplitConfig(seed=2, feedback_size=100, scoring_size=300, eval_size=400)
    big = SplitConfig(seed=2, feedback_size=900, scoring_size=300, eval_size=400)
    a = QuestionSplits(stream(5000), small, "t")
    b = QuestionSplits(stream(5000), big, "t")
    assert ids(a.questions("scoring")) == ids(b.questions("scoring"))
    assert ids(a.questions("eval")) == ids(b.questions("eval"))
    # The smaller feedback set is a prefix of the bigger one.
    assert ids(b.questions("feedback"))[:100] == ids(a.questions("feedback"))


@settings(max_examples=40, deadline=None)
@given(
    st.integers(0, 2**31),
    st.tuples(st.integers(0, 60), st.integers(0, 60), st.integers(0, 60)),
    st.tuples(st.integers(0, 60), st.integers(0, 60), st.integers(0, 60)),
)
def test_membership_never_depends_on_sizes(seed, sizes_a, sizes_b):
    def run(sizes):
        cfg = SplitConfig(seed, *sizes)
        splits = QuestionSplits(stream(600), cfg, "t")
        return {s: ids(splits.questions(s)) for s in SPLITS}

    a, b = run(sizes_a), run(sizes_b)
    for s in SPLITS:
        n = min(len(a[s]), len(b[s]))
        assert a[s][:n] == b[s][:n]  # Same questions, same order, whatever the sizes.
    owners = collections.defaultdict(set)
    for s in SPLITS:
        for q in a[s] + b[s]:
            owners[q].add(s)
    assert all(len(v) == 1 for v in owners.values())


def test_feedback_rounds_are_fresh_and_never_scoring_or_eval():
    cfg = SplitConfig(seed=0, feedback_size=16, scoring_size=64, eval_size=64)
    splits = QuestionSplits(stream(3000), cfg, "t")
    scoring = set(ids(splits.questions("scoring")))
    held_out = set(ids(splits.questions("eval")))
    seen = set()
    for r in range(40):  # 40 revision states, each with its own report questions.
        window = set(ids(splits.feedback_round(r)))
        assert len(window) == 16
        assert not window & scoring and not window & held_out
        assert not window & seen
        seen |= window
    assert ids(splits.feedback_round(0)) == ids(splits.questions("feedback"))


def test_repeated_questions_are_skipped_and_exhaustion_is_an_error():
    cfg = SplitConfig(seed=0, feedback_size=5, scoring_size=5, eval_size=5)
    splits = QuestionSplits(stream(300, repeat_every=3), cfg, "t")
    for s in SPLITS:
        got = ids(splits.take(s, 40))  # 200 distinct questions in 300 draws, about 66 per split.
        assert len(got) == len(set(got))
    with pytest.raises(SplitExhausted, match="only .* distinct eval questions"):
        QuestionSplits(stream(30), cfg, "tiny").take("eval", 29)
    with pytest.raises(ValueError, match="unknown split"):
        splits.take("train", 1)


def test_hash_order_ignores_file_order():
    qs = list(stream(500))
    assert ids(hash_ordered(qs, 7)) == ids(hash_ordered(list(reversed(qs)), 7))
    assert ids(hash_ordered(qs, 7)) != ids(hash_ordered(qs, 8))
