"""The revision-history section of the proposer prompt (`prompt.history`, off by default).

The paper's proposer sees only the current harness h_{t-1} and its report. With history on, it also
sees earlier candidates of the same run: each as a compact unified diff against its parent, its
scoring-set score and validity, and one line of what changed (score delta, questions scored better or
worse, or why the edit failed). Meta-Harness shows that an untrained proposer gains a lot from
reading earlier candidates; this section lets a trained one learn to use them.

Pure functions: `HistoryEntry`s in, text out. The section is rendered within a character budget
(and a token budget when the caller has a token count); when it does not fit, the oldest entries
are dropped first, then every diff is elided, and a note says how many earlier candidates were
omitted. The same entries and config always give the same text.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Callable, Literal, Sequence

SEED_ID = "seed"  # The id of the seed harness in every run (loop.records.SEED_ID).


@dataclasses.dataclass(frozen=True)
class HistoryConfig:
    """Which earlier candidates the proposer sees, and how much room they get."""

    # off: the paper's prompt, byte for byte. last: the `last` newest candidates of the run. pareto:
    # of the candidates best on at least one scoring question (GEPA's front), the `last` newest;
    # meaningful when all were scored on the same questions (adaptation runs, offline states).
    mode: Literal["off", "last", "pareto"] = "off"
    last: int = 8  # At most this many candidates are shown, the newest.
    # Character budget of the rendered section (max_tokens adds one in the proposer's tokens).
    max_chars: int = 4000
    max_tokens: int | None = None  # Also a token budget, counted with the proposer's tokenizer (prompts.token_counter).
    context_lines: int = 1  # Unchanged lines around each change in a diff: compact, still a patch.

    def __post_init__(self):
        if self.mode not in ("off", "last", "pareto"):
            raise ValueError(f"history.mode must be off, last or pareto, got {self.mode!r}")
        if self.last < 1 or self.context_lines < 0:
            raise ValueError("history.last must be >= 1 and history.context_lines >= 0")
        if self.max_chars < 200:
            raise ValueError(f"history.max_chars must be >= 200, got {self.max_chars}")

    @property
    def enabled(self) -> bool:
        return self.mode != "off"


@dataclasses.dataclass(frozen=True)
class HistoryEntry:
    """One earlier candidate, as the history shows it."""

    id: str  # "r{round}c{index}".
    parent: str  # The harness it revised.
    round: int
    kind: str  # The outcome kind (loop.rewards): "ran", "crashed", "SpanNotFound", "flagged:...", ...
    has_code: bool  # The edit applied and gave a harness.
    score: float  # Mean scoring-set score (0 when the edit was invalid).
    scores: tuple[float, ...]  # Per scoring question (empty when invalid); for the Pareto mode.
    parent_score: float | None  # The parent's score on the same questions (None: not measured).
    # Scoring questions on which it scored above / below its parent (partial credit counts), None
    # when the parent's per-question scores on the same questions are not known.
    improved: int | None
    regressed: int | None
    detail: str  # Why the edit failed, first line ("" when valid).
    diff: str  # Unified diff from the parent's code ("" without code).
    selected: bool  # The run carried it into the next round.

    @classmethod
    def from_dict(cls, d: dict) -> HistoryEntry:
        return cls(**{**d, "scores": tuple(d["scores"])})


def compact_diff(parent_code: str, code: str, parent_id: str, entry_id: str, context: int = 1) -> str:
    """A unified diff from `parent_code` to `code`, with `context` unchanged lines around changes."""
    lines = difflib.unified_diff(parent_code.splitlines(), code.splitlines(), parent_id, entry_id, n=context,
                                 lineterm="")
    return "\n".join(lines)


def make_entry(*, id: str, parent: str, round: int, kind: str, has_code: bool, score: float,
               scores: Sequence[float], parent_score: float | None, parent_scores: Sequence[float],
               detail: str, parent_code: str | None, code: str | None, selected: bool,
               context: int = 1) -> HistoryEntry:
    """An entry from a candidate's record: diff and per-question changes are computed here.
    `parent_scores` must be on the same questions as `scores` (else pass () and they are not counted)."""
    same = bool(scores) and len(parent_scores) == len(scores)
    improved = sum(s > p for p, s in zip(parent_scores, scores)) if same else None
    regressed = sum(s < p for p, s in zip(parent_scores, scores)) if same else None
    diff = compact_diff(parent_code, code, parent, id, context) if code is not None and parent_code is not None else ""
    return HistoryEntry(id=id, parent=parent, round=round, kind=kind, has_code=has_code, score=float(score),
                        scores=tuple(float(s) for s in scores), parent_score=parent_score, improved=improved,
                        regressed=regressed, detail=(detail.strip().splitlines() or [""])[0][:200], diff=diff,
                        selected=selected)


# ----- which entries -----


def pareto_front(entries: Sequence[HistoryEntry]) -> list[HistoryEntry]:
    """Entries with code that reach the best score (> 0) among them on at least one question, in
    their order. Only entries scored on the same number of questions as the newest scored one count."""
    scored = [e for e in entries if e.has_code and e.scores]
    if not scored:
        return []
    n = len(scored[-1].scores)
    scored = [e for e in scored if len(e.scores) == n]
    best = [max(e.scores[q] for e in scored) for q in range(n)]
    return [e for e in scored if any(b > 0 and e.scores[q] == b for q, b in enumerate(best))]


def choose(entries: Sequence[HistoryEntry], config: HistoryConfig) -> list[HistoryEntry]:
    """The entries the section may show, oldest first (at most `config.last`)."""
    pool = pareto_front(entries) if config.mode == "pareto" else list(entries)
    return pool[-config.last:]


# ----- rendering -----


def change_line(e: HistoryEntry) -> str:
    """One line on what the candidate changed in the results."""
    if not e.has_code:
        return f"invalid edit ({e.kind}): {e.detail}" if e.detail else f"invalid edit ({e.kind})"
    parts = [f"score {e.score:.3f}"]
    if e.parent_score is not None:
        parts[0] += f" vs parent {e.parent_score:.3f} ({e.score - e.parent_score:+.3f})"
    if e.improved is not None:
        parts.append(f"better than its parent on {e.improved} questions, worse on {e.regressed}")
    if e.kind != "ran":
        parts.append("crashed on some questions" if e.kind == "crashed" else f"outcome {e.kind}")
    return "; ".join(parts)


def render_entry(e: HistoryEntry, with_diff: bool) -> str:
    status = "kept" if e.selected else "not kept"
    head = f"### {e.id} (round {e.round}, revised {e.parent}): {'valid' if e.has_code else 'invalid'}, {status}"
    body = [head, change_line(e)]
    if e.has_code and e.diff:
        if with_diff:
            body.append(f"```diff\n{e.diff}\n```")
        else:
            body.append(f"(diff of {e.diff.count(chr(10)) + 1} lines not shown)")
    elif e.has_code:
        body.append("(no change to the code)")
    return "\n".join(body)


EMPTY = "No earlier candidates in this run: this is its first revision."


def omitted_note(n: int) -> str:
    return f"({n} earlier candidate{'s' if n != 1 else ''} omitted)"


def render_history(entries: Sequence[HistoryEntry], config: HistoryConfig,
                   count_tokens: Callable[[str], int] | None = None) -> str:
    """The section's text, oldest shown entry first, within `config.max_chars` (and `max_tokens`).

    Tries, in order: the chosen entries with their diffs, dropping the oldest one at a time; then
    without diffs, again dropping the oldest; then only the omitted note; then "" (never over budget).
    """
    if config.max_tokens is not None and count_tokens is None:
        raise ValueError("history.max_tokens needs count_tokens")

    def fits(text: str) -> bool:
        return len(text) <= config.max_chars and (config.max_tokens is None or count_tokens(text) <= config.max_tokens)

    if not entries:
        return EMPTY if fits(EMPTY) else ""
    shown = choose(entries, config)
    for with_diff in (True, False):
        for n in range(len(shown), 0, -1):
            text = _render(shown[-n:], len(entries) - n, with_diff)
            if fits(text):
                return text
    note = omitted_note(len(entries))
    return note if fits(note) else ""


def _render(shown: Sequence[HistoryEntry], omitted: int, with_diff: bool) -> str:
    parts = [omitted_note(omitted)] if omitted else []
    parts += [render_entry(e, with_diff) for e in shown]
    return "\n\n".join(parts)
