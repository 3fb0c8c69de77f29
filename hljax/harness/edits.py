"""The proposer's output format: span-replacement edits of the current harness, parsed and applied.

A completion holds one or more SEARCH/REPLACE blocks (plain delimiters, no JSON: small models write
worse code inside JSON strings). `FORMAT_SPEC` below is the one description of the format; the
proposer prompt renders it from here. Parsing is strict about structure; locating a span goes
exact -> whitespace-tolerant and must find exactly one place. Every failure is a typed result.

Whitespace tolerance, and why it is safe for Python: a SEARCH line matches a harness line when
both are equal after dropping trailing whitespace and after one indentation prefix, the same for
every line of the span, is added or removed. The REPLACE lines are re-indented by that prefix, so
indentation inside the span keeps its shape. Blank lines match blank lines. Tabs and spaces are
never interchanged.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from typing import Sequence, Union

SEARCH = "<<<<<<< SEARCH"
DIVIDER = "======="
REPLACE = ">>>>>>> REPLACE"

FORMAT_SPEC = f"""\
Answer with one or more edit blocks. Each block replaces some lines of the current harness:

{SEARCH}
lines copied exactly from the current harness
{DIVIDER}
the lines that take their place
{REPLACE}

Rules:
- SEARCH holds one or more whole, consecutive lines of the current harness, copied exactly,
  indentation included. They must occur exactly once in the harness: add surrounding lines if needed.
- REPLACE holds the new lines, fully indented. Leave it empty to delete the lines.
- Every block is matched against the current harness as shown, so blocks must not share lines.
- Marker lines hold only the marker. Text outside the blocks is ignored.
- The edited harness must still define solve(question, solver) and be valid Python."""

# A line that looks like a marker but is not exactly one: refused rather than read as code.
_MARKER_LIKE = re.compile(r"^\s*(<{5,}|={5,}|>{5,})")


@dataclasses.dataclass(frozen=True)
class Edit:
    """Replace the harness lines equal to `search` with `replace` (lines without line endings)."""

    search: tuple[str, ...]
    replace: tuple[str, ...]

    def inverse(self) -> Edit:
        return Edit(search=self.replace, replace=self.search)


# ----- results --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Applied:
    """The edited harness."""

    code: str
    edits: tuple[Edit, ...]
    tolerant: tuple[bool, ...]  # Per edit: located only by the whitespace-tolerant match.


@dataclasses.dataclass(frozen=True)
class Unparseable:
    """The completion's block structure is broken (or it holds no block at all)."""

    reason: str
    line: int  # 1-based line of the completion where parsing failed; 0 when not tied to a line.

    def describe(self) -> str:
        where = f" (completion line {self.line})" if self.line else ""
        return f"unparseable edit{where}: {self.reason}"


@dataclasses.dataclass(frozen=True)
class Truncated:
    """The completion ended inside a block: cut off mid-edit."""

    complete_edits: int  # Blocks that were complete before the cut.

    def describe(self) -> str:
        return f"completion cut off inside edit block {self.complete_edits + 1}"


@dataclasses.dataclass(frozen=True)
class SpanNotFound:
    """An edit's SEARCH lines occur nowhere in the harness, not even up to whitespace."""

    edit: int  # 0-based index of the edit in the completion.
    nearest: str  # The most similar harness lines, numbered, as a hint.
    nearest_line: int  # 1-based first line of `nearest`; 0 for an empty harness.

    def describe(self) -> str:
        return f"edit {self.edit + 1}: SEARCH lines not found; the closest harness lines are:\n{self.nearest}"


@dataclasses.dataclass(frozen=True)
class AmbiguousSpan:
    """An edit's SEARCH lines occur more than once."""

    edit: int
    lines: tuple[int, ...]  # 1-based first lines of the matches.

    def describe(self) -> str:
        at = ", ".join(map(str, self.lines))
        return f"edit {self.edit + 1}: SEARCH lines occur {len(self.lines)} times (at lines {at}); add context"


@dataclasses.dataclass(frozen=True)
class Overlapping:
    """Two edits' spans share harness lines."""

    first: int
    second: int

    def describe(self) -> str:
        return f"edits {self.first + 1} and {self.second + 1} change overlapping lines"


@dataclasses.dataclass(frozen=True)
class NoOp:
    """Applying the edits leaves the harness unchanged."""

    def describe(self) -> str:
        return "the edits leave the harness unchanged"


@dataclasses.dataclass(frozen=True)
class SyntaxInvalid:
    """The edited harness does not compile."""

    message: str
    line: int | None

    def describe(self) -> str:
        at = f" at line {self.line}" if self.line else ""
        return f"the edited harness does not compile{at}: {self.message}"


EditFailure = Union[Unparseable, Truncated, SpanNotFound, AmbiguousSpan, Overlapping, NoOp, SyntaxInvalid]
EditResult = Union[Applied, EditFailure]


# ----- parsing --------------------------------------------------------------------------------


def _empty_search(index: int, line: int) -> Unparseable:
    return Unparseable(f"edit {index + 1}: SEARCH is empty; it must name lines to replace", line)


def _split_lines(text: str) -> list[str]:
    """Lines split on '\\n' only (not on the other characters str.splitlines breaks at)."""
    return text.replace("\r\n", "\n").split("\n")


def parse(completion: str) -> tuple[Edit, ...] | Unparseable | Truncated:
    """The edit blocks of a completion, in order."""
    edits: list[Edit] = []
    state, search, replace = "outside", [], []
    for n, line in enumerate(_split_lines(completion), start=1):
        marker = line.rstrip()
        if marker not in (SEARCH, DIVIDER, REPLACE) and _MARKER_LIKE.match(line):
            if state != "outside" or "SEARCH" in line:
                return Unparseable(f"malformed marker line {line.strip()!r}", n)
            continue  # Prose such as a markdown underline outside every block.
        if state == "outside":
            if marker == SEARCH:
                state, search, replace = "search", [], []
            elif marker in (DIVIDER, REPLACE):
                return Unparseable(f"{marker!r} outside an edit block", n)
        elif state == "search":
            if marker == DIVIDER:
                if not any(s.strip() for s in search):
                    return _empty_search(len(edits), n)
                state = "replace"
            elif marker in (SEARCH, REPLACE):
                return Unparseable(f"{marker!r} before the {DIVIDER!r} divider", n)
            else:
                search.append(line)
        else:
            if marker == REPLACE:
                edits.append(Edit(tuple(search), tuple(replace)))
                state = "outside"
            elif marker in (SEARCH, DIVIDER):
                return Unparseable(f"{marker!r} inside REPLACE; close the block with {REPLACE!r} first", n)
            else:
                replace.append(line)
    if state != "outside":
        return Truncated(complete_edits=len(edits))
    if not edits:
        return Unparseable("no edit block found", 0)
    return tuple(edits)


def render(edits: Sequence[Edit]) -> str:
    """The completion text that `parse` reads back as `edits` (for SFT targets and examples)."""
    blocks = ["\n".join([SEARCH, *e.search, DIVIDER, *e.replace, REPLACE]) for e in edits]
    return "\n\n".join(blocks) + "\n"


# ----- locating and applying ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Span:
    start: int  # 0-based first line.
    stop: int  # One past the last line.
    indent: tuple[str, str] | None  # (kind, prefix) for a tolerant match: "add" or "remove" prefix.


def _indent_shift(window: Sequence[str], search: Sequence[str]) -> tuple[str, str] | None:
    """The one indentation change that makes `search` equal `window` line by line, or None."""
    shift = None
    for h, s in zip(window, search):
        h, s = h.rstrip(), s.rstrip()
        if not s or not h:
            if s or h:
                return None
            continue
        h_body, s_body = h.lstrip(), s.lstrip()
        if h_body != s_body:
            return None
        h_ind, s_ind = h[: len(h) - len(h_body)], s[: len(s) - len(s_body)]
        if h_ind.startswith(s_ind):
            cand = ("add", h_ind[len(s_ind) :])
        elif s_ind.startswith(h_ind):
            cand = ("remove", s_ind[len(h_ind) :])
        else:
            return None
        if shift is None:
            shift = cand
        elif shift != cand:
            return None
    return shift or ("add", "")


def _nearest(lines: Sequence[str], search: Sequence[str], width: int = 8) -> tuple[str, int]:
    """The harness lines most like `search`, numbered, and the first one's 1-based number."""
    if not lines:
        return "(the harness is empty)", 0
    k = max(1, min(len(search), width, len(lines)))
    target = "\n".join(s.strip() for s in search[:k])
    best, best_ratio = 0, -1.0
    matcher = difflib.SequenceMatcher(autojunk=False)
    matcher.set_seq2(target)
    for i in range(len(lines) - k + 1):
        matcher.set_seq1("\n".join(h.strip() for h in lines[i : i + k]))
        if matcher.real_quick_ratio() <= best_ratio or matcher.quick_ratio() <= best_ratio:
            continue
        ratio = matcher.ratio()
        if ratio > best_ratio:
            best, best_ratio = i, ratio
    return "\n".join(f"{best + j + 1:4d}| {lines[best + j]}" for j in range(k)), best + 1


def _locate(lines: list[str], edit: Edit, index: int) -> _Span | SpanNotFound | AmbiguousSpan | Unparseable:
    k, search = len(edit.search), list(edit.search)
    if not any(s.strip() for s in search):  # Only reachable through `apply`: `parse` refuses it.
        return _empty_search(index, 0)
    starts = range(len(lines) - k + 1)
    exact = [i for i in starts if lines[i] == search[0] and lines[i : i + k] == search]
    if len(exact) == 1:
        return _Span(exact[0], exact[0] + k, None)
    if exact:
        return AmbiguousSpan(index, tuple(i + 1 for i in exact))
    tolerant = [(i, s) for i in starts if (s := _indent_shift(lines[i : i + k], search)) is not None]
    if len(tolerant) == 1:
        i, shift = tolerant[0]
        return _Span(i, i + k, shift)
    if tolerant:
        return AmbiguousSpan(index, tuple(i + 1 for i, _ in tolerant))
    nearest, line = _nearest(lines, search)
    return SpanNotFound(index, nearest, line)


def _reindent(lines: Sequence[str], shift: tuple[str, str] | None) -> list[str]:
    if shift is None or not shift[1]:
        return list(lines)
    kind, prefix = shift
    out = []
    for line in lines:
        if not line.strip():
            out.append(line)
        elif kind == "add":
            out.append(prefix + line)
        else:  # Remove the prefix, or as much of it as the line's own indentation shares.
            ind = line[: len(line) - len(line.lstrip())]
            common = len(_common_prefix(ind, prefix))
            out.append(line[common:])
    return out


def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def _compile_error(code: str) -> SyntaxInvalid | None:
    try:
        compile(code, "harness.py", "exec", dont_inherit=True)
    except SyntaxError as e:
        return SyntaxInvalid(f"{type(e).__name__}: {e.msg}", e.lineno)
    except (ValueError, RecursionError, MemoryError, OverflowError) as e:  # Null bytes, deep nesting.
        return SyntaxInvalid(f"{type(e).__name__}: {e}", None)
    return None


def apply(code: str, edits: Sequence[Edit]) -> EditResult:
    """Apply `edits`, each located in `code` as given (not in the result of the others)."""
    crlf = "\r\n" in code and code.count("\r\n") == code.count("\n")
    text = code.replace("\r\n", "\n") if crlf else code
    final_newline = text.endswith("\n")
    lines = text.split("\n") if text else []
    if final_newline:
        lines.pop()
    spans = []
    for i, edit in enumerate(edits):
        found = _locate(lines, edit, i)
        if not isinstance(found, _Span):
            return found
        spans.append((found, i))
    spans.sort(key=lambda s: s[0].start)
    for (a, i), (b, j) in zip(spans, spans[1:]):
        if b.start < a.stop:
            return Overlapping(min(i, j), max(i, j))
    for span, i in reversed(spans):
        lines[span.start : span.stop] = _reindent(edits[i].replace, span.indent)
    new = "\n".join(lines) + ("\n" if final_newline and lines else "")
    if crlf:
        new = new.replace("\n", "\r\n")
    if new == code:
        return NoOp()
    error = _compile_error(new)
    if error is not None:
        return error
    tolerant = [False] * len(edits)
    for span, i in spans:
        tolerant[i] = span.indent is not None
    return Applied(code=new, edits=tuple(edits), tolerant=tuple(tolerant))


def apply_completion(code: str, completion: str) -> EditResult:
    """Parse a proposer completion and apply its edits to `code`."""
    parsed = parse(completion)
    if isinstance(parsed, (Unparseable, Truncated)):
        return parsed
    return apply(code, parsed)
