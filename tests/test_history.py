"""The proposer prompt's history section (hljax/harness/history.py, prompt.history).

- With history off the prompt is byte-identical to main's before the section existed (golden file
  captured from that code: tests/_prompt_cases.py, tests/data/prompts_golden.json).
- For any history and budget, the section fits its budget and is deterministic.
- A candidate's diff, as shown, applies to its parent and gives the candidate: checked with a patch
  applier written here (and GNU patch when installed), not with the renderer's code.
"""

import json
import os
import re
import shutil
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hljax.harness import history as hh
from hljax.harness import prompts
from hljax.loop import records as rec
from hljax.loop.history import entries_from_rounds
from tests._prompt_cases import _report, cases

GOLDEN = os.path.join(os.path.dirname(__file__), "data", "prompts_golden.json")
ON = hh.HistoryConfig(mode="last", last=8, max_chars=4000)


# ----- byte identity with history off -----


def test_history_off_prompts_are_byte_identical_to_mains():
    with open(GOLDEN) as f:
        golden = json.load(f)
    got = dict(cases())
    assert list(got) == list(golden)
    for name in golden:
        assert got[name] == golden[name], name


def test_history_off_ignores_entries():
    entries = _entries_from_codes(["def solve(q, s):\n    return s(q)\n", "def solve(q, s):\n    return s(q).strip()\n"])
    off = prompts.proposer_messages("t", "def solve(q, s):\n    return q\n", _report(3), history=entries)
    assert off == prompts.proposer_messages("t", "def solve(q, s):\n    return q\n", _report(3))


def test_history_on_adds_one_section_before_the_answer_format():
    entries = _entries_from_codes(["def solve(q, s):\n    return s(q)\n", "def solve(q, s):\n    return s(q).strip()\n"])
    cfg = prompts.PromptConfig(history=ON)
    user = prompts.user_prompt("t", "def solve(q, s):\n    return q\n", _report(3), config=cfg, history=entries)
    titles = [line for line in user.splitlines() if line.startswith("## ")]
    assert titles[-2:] == ["## Earlier candidates in this run (oldest first)", "## Your answer"]
    assert "### r0c0 (round 0, revised seed): valid, kept" in user
    assert "score 1.000 vs parent 0.500 (+0.500); better than its parent on 1 questions, worse on 0" in user
    empty = prompts.user_prompt("t", "x", _report(1), config=cfg)
    assert hh.EMPTY in empty


# ----- building entries from records -----


def _entries_from_codes(codes, kinds=None, config=ON):
    """A keep-if-better chain seed -> r0c0 -> r1c0 ... over `codes` (codes[0] is the seed)."""
    store = {rec.SEED_ID: codes[0]}
    rounds, parent, parent_scores = [], rec.SEED_ID, (1.0, 0.0)
    for t, code in enumerate(codes[1:]):
        cid = rec.candidate_id(t, 0)
        kind = (kinds or {}).get(t, "ran")
        valid = kind in ("ran", "crashed")
        scores = (1.0, 1.0) if valid else ()
        if valid:
            store[cid] = code
        cand = rec.CandidateRecord(cid, parent, "completion", kind, "" if valid else "span not found\nmore",
                                   1.0 if valid else 0.0, scores, valid)
        selected = cid if valid else parent
        rounds.append(rec.RoundRecord("t", t, parent, sum(parent_scores) / 2, parent_scores, 0.0, "", (cand,),
                                      selected, (selected,), 0.0))
        if valid:
            parent, parent_scores = cid, scores
    return entries_from_rounds(rounds, store.get, config)


def test_entries_count_changes_and_failures():
    entries = _entries_from_codes(["a\nb\n", "a\nB\n", "x"], kinds={1: "SpanNotFound"})
    assert [e.id for e in entries] == ["r0c0", "r1c0"]
    first, second = entries
    assert (first.improved, first.regressed, first.parent_score) == (1, 0, 0.5)
    assert first.diff.splitlines()[:2] == ["--- seed", "+++ r0c0"]
    assert not second.has_code and second.diff == "" and second.detail == "span not found"
    assert hh.change_line(second) == "invalid edit (SpanNotFound): span not found"


def test_pareto_mode_keeps_only_front_members():
    def entry(i, scores, has_code=True):
        return hh.HistoryEntry(f"r{i}c0", "seed", i, "ran", has_code, sum(scores) / 2, scores, 0.0, None, None, "",
                               "", False)

    es = [entry(0, (1.0, 0.0)), entry(1, (0.5, 0.0)), entry(2, (0.0, 1.0)), entry(3, (), has_code=False)]
    assert [e.id for e in hh.choose(es, hh.HistoryConfig(mode="pareto"))] == ["r0c0", "r2c0"]
    assert [e.id for e in hh.choose(es, hh.HistoryConfig(mode="last", last=2))] == ["r2c0", "r3c0"]


# ----- budget (hypothesis) -----

_TEXT = st.text(st.characters(min_codepoint=32, max_codepoint=126, blacklist_characters="`"), max_size=60)


@st.composite
def _entry(draw, i):
    has_code = draw(st.booleans())
    n = draw(st.integers(0, 4))
    scores = tuple(draw(st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=n, max_size=n))) if has_code else ()
    diff = "\n".join(draw(st.lists(_TEXT, max_size=30))) if has_code else ""
    return hh.HistoryEntry(
        id=f"r{i}c{draw(st.integers(0, 9))}", parent=draw(st.sampled_from(["seed", "r0c0", "r12c7"])), round=i,
        kind=draw(st.sampled_from(["ran", "crashed", "SpanNotFound", "flagged:constant_answer"])),
        has_code=has_code, score=draw(st.floats(0, 1)), scores=scores,
        parent_score=draw(st.none() | st.floats(0, 1)), improved=draw(st.none() | st.integers(0, 50)),
        regressed=draw(st.none() | st.integers(0, 50)), detail=draw(_TEXT), diff=diff, selected=draw(st.booleans()))


@st.composite
def _history(draw):
    n = draw(st.integers(0, 40))
    return [draw(_entry(i)) for i in range(n)]


def _words(text: str) -> int:
    return len(text.split())


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(entries=_history(), max_chars=st.integers(200, 6000), max_tokens=st.none() | st.integers(0, 800),
       last=st.integers(1, 50), mode=st.sampled_from(["last", "pareto"]))
def test_rendered_history_respects_its_budget_and_is_deterministic(entries, max_chars, max_tokens, last, mode):
    cfg = hh.HistoryConfig(mode=mode, last=last, max_chars=max_chars, max_tokens=max_tokens)
    text = hh.render_history(entries, cfg, _words)
    assert len(text) <= max_chars
    if max_tokens is not None:
        assert _words(text) <= max_tokens
    assert text == hh.render_history(list(entries), cfg, _words)
    shown = re.findall(r"^### (\S+) \(round (\d+)", text, re.M)
    assert len(shown) <= min(last, len(entries))
    if entries and len(shown) < len(entries) and text:
        assert f"({len(entries) - len(shown)} earlier candidate" in text  # The drop is said, with its count.
    if mode == "last" and shown:  # The newest entries are the ones kept, oldest first.
        assert [int(r) for _, r in shown] == [e.round for e in entries[-len(shown):]]


def test_budget_drops_oldest_then_diffs():
    codes = ["def solve(q, s):\n" + "".join(f"    x{i} = {i}\n" for i in range(k)) + "    return s(q)\n"
             for k in range(8)]
    entries = _entries_from_codes(codes)
    full = hh.render_history(entries, ON)
    assert "omitted" not in full and full.count("```diff") == 7
    tight = hh.render_history(entries, hh.HistoryConfig(mode="last", max_chars=450))
    assert tight.startswith("(") and "earlier candidates omitted)" in tight and len(tight) <= 450
    assert tight.rstrip().endswith("```")  # The newest entry keeps its diff.
    tiny = hh.render_history(entries, hh.HistoryConfig(mode="last", max_chars=200))
    assert "not shown" in tiny and "```diff" not in tiny and len(tiny) <= 200


def test_max_tokens_needs_a_count():
    with pytest.raises(ValueError, match="count_tokens"):
        hh.render_history(_entries_from_codes(["a", "b"]), hh.HistoryConfig(mode="last", max_tokens=10))


# ----- the diffs shown apply to their parents -----


def apply_unified_diff(old: list[str], diff: str) -> list[str]:
    """An independent applier of one file's unified diff (headers, then @@ hunks) to `old`'s lines."""
    lines = diff.split("\n")
    assert lines[0].startswith("--- ") and lines[1].startswith("+++ "), lines[:2]
    out, pos, i = [], 0, 2
    while i < len(lines):
        m = re.match(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@$", lines[i])
        assert m, f"bad hunk header {lines[i]!r}"
        start, length = int(m.group(1)), int(m.group(2) or 1)
        at = start - 1 if length else start  # A zero-length range names the line before it.
        assert at >= pos
        out += old[pos:at]
        pos, i = at, i + 1
        while i < len(lines) and not lines[i].startswith("@@"):
            tag, text = lines[i][:1], lines[i][1:]
            if tag in (" ", "-"):
                assert old[pos] == text, f"context/removed line mismatch at {pos}: {old[pos]!r} != {text!r}"
                pos += 1
                if tag == " ":
                    out.append(text)
            else:
                assert tag == "+", lines[i]
                out.append(text)
            i += 1
    return out + old[pos:]


_LINE = st.text(st.characters(min_codepoint=32, max_codepoint=126, blacklist_characters="`"), max_size=12)
_CODE = st.lists(_LINE, max_size=25)


@settings(max_examples=150, deadline=None)
@given(chain=st.lists(_CODE, min_size=2, max_size=5), context=st.integers(0, 3))
def test_each_shown_diff_applies_to_its_parent(chain, context):
    codes = ["\n".join(c) + "\n" for c in chain]
    cfg = hh.HistoryConfig(mode="last", last=50, max_chars=10 ** 6, context_lines=context)
    entries = _entries_from_codes(codes, config=cfg)
    text = hh.render_history(entries, cfg)
    blocks = re.findall(r"^### (\S+) .*?(?:```diff\n(.*?)\n```|\(no change to the code\))", text, re.M | re.S)
    assert [b[0] for b in blocks] == [e.id for e in entries]
    for k, (cid, diff) in enumerate(blocks):
        parent, child = codes[k].splitlines(), codes[k + 1].splitlines()
        if parent == child:
            assert diff == ""
        else:
            assert apply_unified_diff(parent, diff) == child


@pytest.mark.skipif(shutil.which("patch") is None, reason="GNU patch not installed")
def test_shown_diff_applies_with_gnu_patch(tmp_path):
    parent = "def solve(q, s):\n    a = 1\n    b = 2\n    c = 3\n    return s(q)\n"
    child = "def solve(q, s):\n    a = 1\n    b = 20\n    c = 3\n    d = 4\n    return s(q).strip()\n"
    text = hh.render_history(_entries_from_codes([parent, child]), ON)
    diff = re.search(r"```diff\n(.*?)\n```", text, re.S).group(1)
    (tmp_path / "h.py").write_text(parent)
    subprocess.run(["patch", "-s", str(tmp_path / "h.py")], input=diff + "\n", text=True, check=True)
    assert (tmp_path / "h.py").read_text() == child
