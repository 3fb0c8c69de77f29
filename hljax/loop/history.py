"""A run's revision history, from its records: the `HistoryEntry`s the proposer is shown.

Built only from what `records.RunStore` persists (rounds.jsonl and harness files), so a resumed run
shows the proposer the same history as an uninterrupted one.
"""

from __future__ import annotations

from typing import Callable, Sequence

from hljax.harness.history import HistoryConfig, HistoryEntry, make_entry
from hljax.loop.records import RoundRecord


def entries_from_rounds(rounds: Sequence[RoundRecord], code_of: Callable[[str], str | None],
                        config: HistoryConfig) -> tuple[HistoryEntry, ...]:
    """Every candidate of `rounds`, in round then proposal order. `code_of(id)`: a harness's code, or
    None when it has none. Every candidate is scored on the run's fixed scoring questions, as its parent
    was in that round (`parent_scores`), so per-question changes compare like with like."""
    out = []
    for r in rounds:
        parent_code = code_of(r.parent)
        for c in r.candidates:
            out.append(make_entry(
                id=c.id, parent=c.parent, round=r.round, kind=c.kind, has_code=c.has_code, score=c.score,
                scores=c.scores, parent_score=r.parent_score, parent_scores=r.parent_scores, detail=c.detail,
                parent_code=parent_code, code=code_of(c.id) if c.has_code else None, selected=c.id == r.selected,
                context=config.context_lines))
    return tuple(out)


def store_code(store) -> Callable[[str], str | None]:
    """`code_of` for a `records.RunStore`."""

    def code_of(harness_id: str) -> str | None:
        try:
            return store.harness(harness_id)
        except FileNotFoundError:
            return None

    return code_of
