"""Harness variants and the fixes of the simulated solver's weaknesses, as edits (hljax/data/harness_fixes.py)."""

import json
import os
import random
import subprocess
import sys

import pytest

from hljax.data import harness_fixes as hf
from hljax.harness import contract, edits, seeds
from hljax.loop.revision import candidate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_default_variant_is_the_seed_harness_byte_for_byte():
    assert hf.render(hf.Variant()) == seeds.load("reasoning")


def test_every_fix_of_every_variant_applies_and_copies_its_span_from_that_harness():
    rng = random.Random(0)
    shapes = set()
    for _ in range(300):
        v = hf.random_variant(rng, max_fixes=4)
        code = hf.render(v)
        assert contract.check(code) is None, code
        compile(code, "harness.py", "exec")
        for kind in (k for k in hf.KINDS if k not in v.fixes):
            completion = hf.fix_completion(v, kind)
            parsed = edits.parse(completion)
            span = "\n".join(parsed[0].search)
            assert len(parsed) == 1 and span in code  # The span is the harness's own text.
            result = candidate(code, completion)
            assert isinstance(result, edits.Applied) and result.code == hf.render(v.with_fix(kind)), (code, completion)
            shapes.add(span)
    assert len(shapes) > 100  # Spans differ with the harness: no one SEARCH text serves them all.


def test_a_fix_is_added_once_and_kinds_are_checked():
    v = hf.Variant(fixes=("format",))
    with pytest.raises(ValueError, match="already carries the format fix"):
        v.with_fix("format")
    with pytest.raises(ValueError, match="fixes must be distinct kinds"):
        hf.Variant(fixes=("speed",))
    with pytest.raises(ValueError, match="nothing to edit"):
        hf.edit_between("x = 1\n", "x = 1\n")


def test_the_seed_edits_read_as_written():
    """The edit that adds the check to the seed harness, spelled out (an independent reference)."""
    want = (
        "Ask the solver to check its draft answer.\n\n"
        "<<<<<<< SEARCH\n"
        "    return solver.generate(question).strip()\n"
        "=======\n"
        "    draft = solver.generate(question)\n"
        '    reply = solver.generate(question + "\\n\\nProposed answer: " + draft + "\\nIf it is wrong, give the '
        'corrected answer in the same form; otherwise repeat it exactly.")\n'
        "    return reply.strip()\n"
        ">>>>>>> REPLACE\n"
    )
    assert hf.fix_completion(hf.Variant(), "careless") == want


def test_the_quote_copies_the_first_answer_the_report_shows():
    report = ("3 feedback questions: mean score 0.000; ...\n\n### Question 2: ok, score 0.00\nQuestion: What?\n"
              "Reference answer: <answer>4</answer>\nHarness answer: Quick answer: <answer>5</answer>\n\n"
              "P.S. An earlier draft said: <answer>6</answer>\nSolver calls: 1 (30 prompt + 9 completion tokens)\n\n"
              "### Question 1: ok, score 0.00\nHarness answer: The answer is 4.")
    assert hf.quote(report) == ("Harness answer: Quick answer: <answer>5</answer> P.S. An earlier draft said: "
                                "<answer>6</answer>")
    long = "Harness answer: " + " ".join(f"w{i}" for i in range(20)) + "\nSolver calls: 1"
    assert hf.quote(long) == "Harness answer: w0 w1 w2 w3 w4 w5 ... w14 w15 w16 w17 w18 w19"
    assert hf.quote("### Question 1: error, score n/a\nException: NameError: name 'x' is not defined") == \
        "Exception: NameError: name 'x' is not defined"
    completion = hf.fix_completion(hf.Variant(), "format", report)
    assert completion.startswith("The report shows: Harness answer: Quick answer:")
    assert isinstance(candidate(seeds.load("reasoning"), completion), edits.Applied)


def test_the_fixes_a_harness_carries_are_read_off_its_text():
    rng = random.Random(3)
    for _ in range(300):
        v = hf.random_variant(rng)
        assert hf.fixes_in(hf.render(v)) == set(v.fixes), v
    assert hf.fixes_in(seeds.load("reasoning")) == set()
    # Each kind alone, in the seed's names: its own signature and no other.
    for kind in hf.KINDS:
        assert hf.fixes_in(hf.render(hf.Variant(fixes=(kind,)))) == {kind}


def test_the_generator_pairs_each_harness_with_one_fix_or_with_every_fix_it_lacks(tmp_path):
    """scripts/make_sft_tiny.py: --fixes all gives each harness and report of --fixes one's draws every
    fix it lacks, one row each (so nothing in a prompt predicts the fix), under the tiny configs'
    prompt (task descriptions cut to a token budget, counted with the bundled tokenizer)."""
    rows = {}
    for fixes in ("one", "all"):
        out = tmp_path / f"{fixes}.jsonl"
        subprocess.run([sys.executable, "scripts/make_sft_tiny.py", "--rounds", "2", "--seed", "3", "--fixes", fixes,
                        "--out", str(out)], cwd=ROOT, check=True, capture_output=True, timeout=600)
        rows[fixes] = [json.loads(line) for line in out.read_text().splitlines()]
    one = {r["id"]: r for r in rows["one"]}
    assert len(one) == 2 * 21
    by_state = {}
    for r in rows["all"]:
        by_state.setdefault(r["id"].rsplit("-", 1)[0], []).append(r)
    assert by_state.keys() == one.keys()
    for state, group in by_state.items():
        lacks = set(hf.KINDS) - hf.fixes_in(group[0]["harness"])
        assert sorted(r["source"] for r in group) == sorted(f"generated:{k}" for k in lacks)
        assert one[state]["source"] in {r["source"] for r in group}
        for r in group:
            assert (r["harness"], r["messages"]) == (one[state]["harness"], one[state]["messages"])


def test_the_bundled_sft_data_is_what_the_generator_makes_today(tmp_path):
    """data/sft_tiny.jsonl (the tiny default's SFT rows) is scripts/make_sft_tiny.py's output with its
    defaults: a change to the solver, the tasks or the prompt that moves a row shows here."""
    out = tmp_path / "sft_tiny.jsonl"
    subprocess.run([sys.executable, "scripts/make_sft_tiny.py", "--out", str(out)], cwd=ROOT, check=True,
                   capture_output=True, timeout=600)
    with open(os.path.join(ROOT, "data", "sft_tiny.jsonl")) as f:
        bundled = f.read()
    assert out.read_text() == bundled, "regenerate: python scripts/make_sft_tiny.py"
