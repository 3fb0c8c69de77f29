"""Answer formats: what each demands, how the answer is read back, and the seeded choice."""

import collections
import time

import pytest

from hljax.tasks.formats import FORMATS, INTROS, check_format_names, choose_format, render_question
from hljax.tasks.splits import question_id

ANSWERS = ["42", "-3/7", "a b c", "1 2\n3 4", "{x}", "\\frac{1}{2}", 'say "hi"', "Zoey is a knight"]


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("answer", ANSWERS)
def test_render_then_extract_round_trips(fmt, answer):
    f = FORMATS[fmt]
    assert f.extract(f.render(answer)) == answer
    # After some reasoning, too (except bare, where the whole reply is the answer).
    if fmt != "bare":
        assert f.extract("Let me think step by step.\nSo...\n" + f.render(answer)) == answer


def test_extraction_by_hand():
    names = ("answer_tags", "final_line", "boxed", "json", "bare")
    tags, final, boxed, as_json, bare = (FORMATS[n].extract for n in names)
    assert tags("<answer>1</answer> then <answer> 2 </answer>") == "2"  # The last one counts.
    assert tags("<answer>unclosed") is None
    assert final("Final answer: 3\nFINAL ANSWER:  7 ") == "7"
    assert final("the answer is 7") is None
    assert boxed("\\boxed{1} and \\boxed{\\frac{3}{4}}") == "\\frac{3}{4}"
    assert boxed("\\boxed{{1, 2}") == "{1, 2"  # Unbalanced: up to the last closing brace.
    assert boxed("boxed 5") is None
    assert as_json('I think {"answer": "x"} no, {"answer": "y"}.') == "y"
    assert as_json('{"answer": 12}') == "12"
    assert as_json('{"result": "y"}') is None and as_json("{not json") is None
    assert bare("  9\n") == "9"


def test_hostile_json_reply_stays_fast():
    start = time.perf_counter()
    assert FORMATS["json"].extract('{"a": ' * 50_000) is None
    assert time.perf_counter() - start < 2.0


def test_format_choice_is_seeded_per_question_and_uses_every_format():
    names = tuple(sorted(FORMATS))
    qids = [question_id("t", str(i)) for i in range(2000)]
    picks = [choose_format(q, 0, names) for q in qids]
    assert picks == [choose_format(q, 0, names) for q in qids]
    counts = collections.Counter(picks)
    assert set(counts) == set(names) and min(counts.values()) > 300
    assert picks != [choose_format(q, 1, names) for q in qids]
    assert {choose_format(q, 0, ("bare",)) for q in qids[:50]} == {"bare"}


def test_render_puts_problem_between_intro_and_demand():
    text = render_question("  What is 2+2?  ", question_id("t", "q"), 0, "boxed")
    intro, problem, demand = text.split("\n\n")
    assert intro in INTROS and problem == "What is 2+2?"
    assert demand.removeprefix("Answer format: ") in FORMATS["boxed"].phrasings
    assert text == render_question("What is 2+2?", question_id("t", "q"), 0, "boxed")
    intros = {render_question("p", question_id("t", str(i)), 0, "bare").split("\n\n")[0] for i in range(200)}
    assert intros == set(INTROS)


def test_format_names_are_checked():
    check_format_names(("bare", "json"))
    with pytest.raises(ValueError, match="unknown answer formats"):
        check_format_names(("bare", "xml"))
    with pytest.raises(ValueError, match="repeat"):
        check_format_names(("bare", "bare"))
    with pytest.raises(ValueError, match="at least one"):
        check_format_names(())
