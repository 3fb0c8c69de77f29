"""SFT rows with a history (collect `history`): the teacher's earlier proposals for the same task,
rebuilt from the rows on disk. No model: rows are written by hand here."""

import json
import re

import pytest

from configs import collect_tiny
from hljax.config import ConfigError, check_rerun, to_json
from hljax.data import collect as co
from hljax.data.collect_config import CollectConfig
from hljax.harness import history as hh
from hljax.harness import seeds
from tests.test_history import apply_unified_diff

SEED = seeds.load("reasoning")
CFG = hh.HistoryConfig(mode="last", last=8, max_chars=6000)


def _row(task, r, k, candidate, score, reason="", details=None, runs_clean=True):
    return {"id": co.row_id(task, r, k), "task": task, "round": r, "proposal": k, "candidate": candidate,
            "scores": {"parent": 0.25, "candidate": score, "candidate_feedback": score},
            "filters": {"valid_edit": candidate is not None, **({"runs_clean": runs_clean} if score is not None else {})},
            "details": details or {}, "reason": reason, "kept": not reason}


def test_history_from_rows_shows_earlier_rounds_of_the_same_task_in_order():
    better = SEED.replace("strip()", "strip().lower()")
    rows = [
        _row("rg_gcd", 1, 0, better, 0.5),  # Written out of order: sorted by round, then proposal.
        _row("rg_gcd", 0, 1, None, None, "valid_edit", {"valid_edit": "SpanNotFound: edit 1: not found\nmore"}),
        _row("rg_gcd", 0, 0, better, 0.0, "improves", runs_clean=False),
        _row("rg_gcd", 0, 2, better, None, "no_reference_access", {"no_reference_access": "imports gc"}),
        _row("rg_gcd", 2, 0, better, 1.0),  # Not earlier than round 2.
        _row("rg_lcm", 0, 0, better, 1.0),  # Another task.
    ]
    entries = co.history_from_rows(rows, "rg_gcd", 2, SEED, CFG)
    assert [(e.id, e.kind, e.has_code) for e in entries] == [
        ("r0c0", "crashed", True), ("r0c1", "invalid", False), ("r0c2", "filtered:no_reference_access", False),
        ("r1c0", "ran", True)]
    assert entries[1].detail == "SpanNotFound: edit 1: not found" and entries[2].detail == "imports gc"
    assert all(e.parent == "seed" and not e.selected for e in entries)
    text = hh.render_history(entries, CFG)
    assert "### r1c0 (round 1, revised seed): valid, not kept\nscore 0.500 vs parent 0.250 (+0.250)" in text
    diff = re.search(r"### r1c0 .*?```diff\n(.*?)\n```", text, re.S).group(1)
    assert apply_unified_diff(SEED.splitlines(), diff) == better.splitlines()
    assert co.history_from_rows(rows, "rg_gcd", 0, SEED, CFG) == ()


def _config(**overrides):
    c = collect_tiny.get_config()
    for key, value in overrides.items():
        node, _, leaf = key.rpartition(".")
        setattr(c[node] if node else c, leaf, value)
    return CollectConfig.from_config(c)


def test_history_needs_the_prompt_section_and_old_collections_resume(tmp_path):
    with pytest.raises(ConfigError, match="prompt.history.mode"):
        _config(history=True)
    # A collection saved before these settings existed lacks both keys: it resumes (absent = default).
    saved = to_json(_config())
    saved.pop("history")
    saved["prompt"].pop("history")
    path = tmp_path / "rows.config.json"
    path.write_text(json.dumps(saved))
    assert check_rerun(str(path), _config(), "collect") == []
    # Turning history on changes the rows' prompts: refused, naming both keys.
    with pytest.raises(ConfigError, match=r"prompt\.history\.mode 'off' -> 'last'; history False -> True"):
        check_rerun(str(path), _config(**{"history": True, "prompt.history.mode": "last"}), "collect")
