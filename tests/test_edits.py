"""The span-replacement edit format: parsing, locating, applying, and every typed failure."""

import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hljax.harness import edits
from hljax.harness.edits import (
    AmbiguousSpan,
    Applied,
    Edit,
    NoOp,
    Overlapping,
    SpanNotFound,
    SyntaxInvalid,
    Truncated,
    Unparseable,
)

HARNESS = """\
import re


def solve(question, solver):
    answer = solver.generate(question)
    return answer.strip()
"""


def block(search: str, replace: str) -> str:
    return f"<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE\n"


def test_single_edit_exact():
    completion = "I will strip less.\n" + block("    return answer.strip()", "    return answer.strip().lower()")
    result = edits.apply_completion(HARNESS, completion)
    assert isinstance(result, Applied)
    assert result.code == HARNESS.replace("return answer.strip()", "return answer.strip().lower()")
    assert result.tolerant == (False,)


def test_parse_reads_lines_and_ignores_prose():
    completion = "Plan:\n```\n" + block("a\n  b", "c") + "```\nDone."
    assert edits.parse(completion) == (Edit(("a", "  b"), ("c",)),)


def test_render_parse_round_trip():
    es = (Edit(("x = 1",), ("x = 2", "y = 3")), Edit(("z = 0",), ()))
    assert edits.parse(edits.render(es)) == es


def test_multi_edit_located_in_original_and_applied_together():
    completion = block("import re", "import json") + block(
        "    answer = solver.generate(question)", "    answer = solver.generate(question, temperature=0.0)"
    )
    result = edits.apply_completion(HARNESS, completion)
    assert isinstance(result, Applied)
    assert result.code == (
        "import json\n\n\ndef solve(question, solver):\n"
        "    answer = solver.generate(question, temperature=0.0)\n    return answer.strip()\n"
    )


def test_delete_lines_with_empty_replace():
    code = "x = 1\ny = 2\nz = 3\n"
    result = edits.apply_completion(code, "<<<<<<< SEARCH\ny = 2\n=======\n>>>>>>> REPLACE\n")
    assert isinstance(result, Applied) and result.code == "x = 1\nz = 3\n"


def test_edit_at_file_start_and_end():
    code = "a = 1\nb = 2\nc = 3"  # No final newline: it must stay absent.
    result = edits.apply_completion(code, block("a = 1", "a0 = 0\na = 1") + block("c = 3", "c = 4"))
    assert isinstance(result, Applied)
    assert result.code == "a0 = 0\na = 1\nb = 2\nc = 4"


def test_crlf_harness_keeps_crlf_and_matches_lf_search():
    code = "x = 1\r\ny = 2\r\n"
    result = edits.apply_completion(code, block("y = 2", "y = 3"))
    assert isinstance(result, Applied) and result.code == "x = 1\r\ny = 3\r\n"


def test_crlf_completion_is_read_as_lines():
    completion = block("y = 2", "y = 3").replace("\n", "\r\n")
    result = edits.apply_completion("x = 1\ny = 2\n", completion)
    assert isinstance(result, Applied) and result.code == "x = 1\ny = 3\n"


def test_tabs_exact_match():
    code = "def solve(q, s):\n\tx = 1\n\treturn str(x)\n"
    result = edits.apply_completion(code, block("\tx = 1", "\tx = 2"))
    assert isinstance(result, Applied) and result.code == "def solve(q, s):\n\tx = 2\n\treturn str(x)\n"


def test_tolerant_match_reindents_with_tabs():
    code = "def solve(q, s):\n\tif q:\n\t\treturn q\n\treturn ''\n"
    # The model dropped the leading tab of every line; the shift is one tab, restored on REPLACE.
    result = edits.apply_completion(code, block("if q:\n\treturn q", "if q:\n\treturn q.upper()"))
    assert isinstance(result, Applied)
    assert result.code == "def solve(q, s):\n\tif q:\n\t\treturn q.upper()\n\treturn ''\n"
    assert result.tolerant == (True,)


def test_tolerant_match_dedented_search_keeps_relative_indentation():
    code = "def solve(q, s):\n    if q:\n        return q\n    return ''\n"
    result = edits.apply_completion(code, block("if q:\n    return q", "if q and q[0]:\n    return q[0]"))
    assert isinstance(result, Applied)
    assert result.code == "def solve(q, s):\n    if q and q[0]:\n        return q[0]\n    return ''\n"


def test_tolerant_match_over_indented_search_and_trailing_spaces():
    code = "x = 1\ny = 2\n"
    result = edits.apply_completion(code, block("    y = 2   ", "    y = 5"))
    assert isinstance(result, Applied) and result.code == "x = 1\ny = 5\n"


def test_tolerant_match_refuses_inconsistent_indentation():
    code = "def f():\n    a = 1\n    b = 2\n"
    result = edits.apply_completion(code, block("    a = 1\nb = 2", "    a = 3\nb = 4"))
    assert isinstance(result, SpanNotFound)


def test_tabs_and_spaces_are_not_interchanged():
    code = "def f():\n\ta = 1\n"
    result = edits.apply_completion(code, block("    a = 1", "    a = 2"))
    assert isinstance(result, SpanNotFound)


def test_unicode_lines():
    code = "GREETING = 'héllo wörld ✓'\nSEP = '\u2028'\n"  # U+2028 must not split a line.
    result = edits.apply_completion(code, block("GREETING = 'héllo wörld ✓'", "GREETING = '日本語 ✓'"))
    assert isinstance(result, Applied) and result.code == "GREETING = '日本語 ✓'\nSEP = '\u2028'\n"


# ----- typed failures -------------------------------------------------------------------------


def test_unparseable_without_blocks():
    assert edits.apply_completion(HARNESS, "Just use a better prompt.") == Unparseable("no edit block found", 0)


@pytest.mark.parametrize(
    "completion, line",
    [
        ("=======\nx\n>>>>>>> REPLACE\n", 1),  # Divider outside a block.
        ("<<<<<<< SEARCH\nx = 1\n>>>>>>> REPLACE\n", 3),  # No divider.
        ("<<<<<<< SEARCH\nx = 1\n<<<<<<< SEARCH\n", 3),  # Nested SEARCH.
        ("<<<<<<< SEARCH\nx = 1\n=======\nx = 2\n=======\n", 5),  # Second divider.
        ("<<<<<< SEARCH\nx = 1\n=======\nx = 2\n>>>>>>> REPLACE\n", 1),  # Six '<': malformed opener.
        ("<<<<<<< SEARCH\nx = 1\n========\nx = 2\n>>>>>>> REPLACE\n", 3),  # Eight '=': malformed.
        ("<<<<<<< SEARCH\n\n   \n=======\nx = 2\n>>>>>>> REPLACE\n", 4),  # Blank SEARCH.
    ],
)
def test_unparseable_structure(completion, line):
    result = edits.parse(completion)
    assert isinstance(result, Unparseable) and result.line == line


def test_apply_refuses_an_empty_search():
    result = edits.apply("x = 1\n", [Edit(("x = 1",), ("x = 2",)), Edit(("  ",), ("y = 1",))])
    assert result == Unparseable("edit 2: SEARCH is empty; it must name lines to replace", 0)


@pytest.mark.parametrize(
    "completion, complete",
    [
        ("<<<<<<< SEARCH\nx = 1\n", 0),
        ("<<<<<<< SEARCH\nx = 1\n=======\nx = ", 0),
        (block("x = 1", "x = 2") + "<<<<<<< SEARCH\ny = 1\n=======\n", 1),
    ],
)
def test_truncated(completion, complete):
    assert edits.apply_completion("x = 1\ny = 1\n", completion) == Truncated(complete)


def test_span_not_found_gives_nearest_lines():
    result = edits.apply_completion(HARNESS, block("    answer = solver.generate(question, n=2)", "    pass"))
    assert isinstance(result, SpanNotFound)
    assert result.edit == 0 and result.nearest_line == 5
    assert result.nearest == "   5|     answer = solver.generate(question)"


def test_ambiguous_span():
    code = "x = 1\ny = 2\nx = 1\n"
    assert edits.apply_completion(code, block("x = 1", "x = 3")) == AmbiguousSpan(0, (1, 3))


def test_ambiguous_only_under_tolerance():
    code = "def f():\n    x = 1\ndef g():\n        x = 1\n"
    assert edits.apply_completion(code, block("x = 1", "x = 3")) == AmbiguousSpan(0, (2, 4))


def test_overlapping_edits():
    code = "a = 1\nb = 2\nc = 3\n"
    completion = block("a = 1\nb = 2", "a = 0") + block("b = 2\nc = 3", "c = 0")
    assert edits.apply_completion(code, completion) == Overlapping(0, 1)


def test_same_span_twice_is_overlapping():
    code = "a = 1\nb = 2\n"
    assert edits.apply_completion(code, block("b = 2", "b = 3") + block("b = 2", "b = 4")) == Overlapping(0, 1)


def test_adjacent_edits_do_not_overlap():
    result = edits.apply_completion("a = 1\nb = 2\n", block("a = 1", "a = 5") + block("b = 2", "b = 6"))
    assert isinstance(result, Applied) and result.code == "a = 5\nb = 6\n"


def test_noop():
    assert edits.apply_completion(HARNESS, block("import re", "import re")) == NoOp()


def test_noop_by_tolerant_match_with_identical_lines():
    # Tolerant matching adds the harness's indentation back: the result equals the input.
    code = "def f():\n    return 1\n"
    assert edits.apply_completion(code, block("return 1", "return 1")) == NoOp()


def test_syntax_invalid():
    result = edits.apply_completion(HARNESS, block("    return answer.strip()", "    return answer.strip("))
    assert isinstance(result, SyntaxInvalid) and result.line == 6


def test_syntax_invalid_bad_indentation():
    result = edits.apply_completion(HARNESS, block("    return answer.strip()", "  return answer"))
    assert isinstance(result, SyntaxInvalid) and "IndentationError" in result.message


def test_null_byte_is_syntax_invalid_not_an_exception():
    result = edits.apply_completion("x = 1\n", block("x = 1", "x = '\0'"))
    assert isinstance(result, SyntaxInvalid)


def test_failures_describe_themselves():
    failures = [
        Unparseable("no edit block found", 0),
        Truncated(1),
        SpanNotFound(0, "   1| x", 1),
        AmbiguousSpan(1, (1, 4)),
        Overlapping(0, 2),
        NoOp(),
        SyntaxInvalid("SyntaxError: bad", 3),
    ]
    texts = [f.describe() for f in failures]
    assert texts[2] == "edit 1: SEARCH lines not found; the closest harness lines are:\n   1| x"
    assert texts[3] == "edit 2: SEARCH lines occur 2 times (at lines 1, 4); add context"
    assert texts[4] == "edits 1 and 3 change overlapping lines"
    assert len(set(texts)) == len(texts)


def test_format_spec_uses_the_parser_markers():
    assert edits.SEARCH in edits.FORMAT_SPEC and edits.DIVIDER in edits.FORMAT_SPEC
    assert edits.REPLACE in edits.FORMAT_SPEC


# ----- property: an edit followed by its inverse restores the original ------------------------

_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)


@st.composite
def harness_and_edit(draw):
    """A module of unique assignment lines (some indented in a function) and an edit of a span."""
    n = draw(st.integers(min_value=1, max_value=12))
    indent = draw(st.sampled_from(["    ", "\t"]))
    top = [f"v{i} = {draw(_text)!r}" for i in range(n)]
    body = [f"{indent}w{i} = {draw(_text)!r}" for i in range(draw(st.integers(0, 4)))]
    lines = top + (["def solve(question, solver):", *body, f"{indent}return ''"] if body else [])
    start = draw(st.integers(0, n - 1))
    stop = draw(st.integers(start + 1, n))
    k = draw(st.integers(min_value=1, max_value=4))
    replace = tuple(f"r{j}_{draw(st.sampled_from(string.ascii_lowercase))} = {draw(_text)!r}" for j in range(k))
    newline = draw(st.sampled_from(["\n", "\r\n"]))
    final = draw(st.booleans())
    code = newline.join(lines) + (newline if final else "")
    return code, Edit(tuple(lines[start:stop]), replace)


@settings(max_examples=150, deadline=None)
@given(harness_and_edit())
def test_edit_then_inverse_restores_original(case):
    code, edit = case
    forward = edits.apply_completion(code, edits.render([edit]))
    assert isinstance(forward, Applied), forward
    assert forward.code != code
    back = edits.apply(forward.code, [edit.inverse()])
    assert isinstance(back, Applied), back
    if "\n" not in forward.code:  # One line and no break: nothing says CRLF any more, the inverse writes LF.
        code = code.replace("\r\n", "\n")
    assert back.code == code


_FAILURES = (Unparseable, Truncated, SpanNotFound, AmbiguousSpan, Overlapping, NoOp, SyntaxInvalid)
_pieces = st.sampled_from(
    [edits.SEARCH, edits.DIVIDER, edits.REPLACE, "x = 1", "    x = 1", "\tx = 1", "", "  ", "def f():", "=====",
     "é\u2028"]
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(_pieces | _text, max_size=14), st.lists(_pieces | _text, max_size=8), st.sampled_from(["\n", "\r\n"]))
def test_any_completion_gives_a_typed_result(completion_lines, harness_lines, newline):
    result = edits.apply_completion(newline.join(harness_lines), "\n".join(completion_lines))
    assert isinstance(result, (Applied, *_FAILURES))
