"""EM and F1 against values computed by hand."""

import pytest

from hljax.tasks.qa_metrics import best_over_golds, exact_match, f1_score, normalize_answer


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The  Eiffel Tower!", "eiffel tower"),
        ("A. B. C.", "b c"),  # "a b c" after punctuation, then the article "a" goes.
        ("an apple and the pear", "apple and pear"),
        ("Theatre", "theatre"),  # Articles only as whole words.
        ("U.S.A.", "usa"),
        ("1,200 people", "1200 people"),
        ("  yes\n", "yes"),
        ("the", ""),
    ],
)
def test_normalize(text, expected):
    assert normalize_answer(text) == expected


def test_exact_match():
    assert exact_match("the Eiffel Tower.", "Eiffel tower") == 1.0
    assert exact_match("Eiffel", "Eiffel Tower") == 0.0
    assert exact_match("An Apple", "apple") == 1.0


def test_f1_by_hand():
    # pred {barack, obama, jr}, gold {barack, obama}: p = 2/3, r = 1, f1 = 2 * 2/3 / (5/3) = 0.8.
    assert f1_score("Barack Obama Jr.", "Barack Obama", yes_no_rule=True) == pytest.approx(0.8)
    # pred "cat cat" (after "the the" goes), gold "cat": common 1, p = 1/2, r = 1, f1 = 2/3.
    assert f1_score("the the cat cat", "cat", yes_no_rule=False) == pytest.approx(2 / 3)
    # p = 1/3, r = 1/2: f1 = 2 * (1/6) / (5/6) = 0.4.
    assert f1_score("new york city", "york state", yes_no_rule=False) == pytest.approx(0.4)
    assert f1_score("Paris", "London", yes_no_rule=True) == 0.0


def test_yes_no_rule():
    # Without the rule "no way" vs "no" gets p = 1/2, r = 1: f1 = 2/3; with it, 0.
    assert f1_score("no way", "no", yes_no_rule=False) == pytest.approx(2 / 3)
    assert f1_score("no way", "no", yes_no_rule=True) == 0.0
    assert f1_score("yes", "yes indeed", yes_no_rule=True) == 0.0
    assert f1_score("Yes.", "yes", yes_no_rule=True) == 1.0
    assert f1_score("noanswer", "no answer", yes_no_rule=True) == 0.0


def test_empty_after_normalisation():
    assert f1_score("", "the", yes_no_rule=False) == 1.0
    assert f1_score("", "Paris", yes_no_rule=True) == 0.0
    assert f1_score("a an the", "Paris", yes_no_rule=False) == 0.0


def test_aliases_take_the_best_gold():
    golds = ["euro", "EUR", "Euro currency"]
    assert best_over_golds(exact_match, "EUR", golds) == 1.0
    assert best_over_golds(exact_match, "the euro currency", golds) == 1.0
    # "euros" vs "euro currency": no common token; vs "EUR": none. 0.
    assert best_over_golds(exact_match, "euros", golds) == 0.0
    f1 = lambda p, g: f1_score(p, g, yes_no_rule=False)  # noqa: E731
    # "currency" vs "euro currency": p = 1, r = 1/2, f1 = 2/3 (beats 0 against the others).
    assert best_over_golds(f1, "currency", golds) == pytest.approx(2 / 3)
    with pytest.raises(ValueError):
        best_over_golds(exact_match, "x", [])
