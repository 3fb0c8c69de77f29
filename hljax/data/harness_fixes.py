"""Reasoning harnesses of many shapes and the five fixes of the simulated solver's weaknesses
(hljax/tasks/bottlenecks.py), written as span-replacement edits of whatever harness they are given.

A `Variant` is a harness: its names, docstring, comment and the fixes it already carries, rendered
by `render`. `fix_completion(variant, kind, report)` is the proposer answer that adds fix `kind` to
it: a line quoting the first answer the execution report shows (what the fix should be chosen on,
copied, not interpreted), a note, then one edit block whose SEARCH lines are copied from that
variant's own text (the smallest run of changed lines, widened until it is unique). Used for the
SFT data of the tiny default (scripts/make_sft_tiny.py), the fixed-edit and oracle rows of
bench/learning.py, and tests.
"""

from __future__ import annotations

import dataclasses
import random
import re

from hljax.harness import edits
from hljax.tasks.bottlenecks import KINDS

SEED_DOC = "Seed harness for Reasoning Gym: one solver call with the question, as in the paper."

# What each fix does, as the note before its edit block.
NOTES = {
    "format": "Insist that the solver answers exactly in the requested format.",
    "truncation": "Give the solver more tokens so that its reply is not cut off.",
    "careless": "Ask the solver to check its draft answer.",
    "variance": "Sample five answers and return the most common one.",
    "buried": "Cut the reply at a trailing P.S. note.",
}

FORMAT_TEXT = r'"\n\nReply with the final answer only, exactly in the format asked above."'
CHECK_TEXT = (r'"\n\nProposed answer: " + draft + "\nIf it is wrong, give the corrected answer in the same form; '
              r'otherwise repeat it exactly."')

QUESTION_NAMES = ("question", "q", "problem", "task", "text")
REPLY_NAMES = ("reply", "answer", "out", "response", "result")
PROMPT_NAMES = ("prompt", "message", "query", "request")
DOCS = (SEED_DOC, "", "Harness: ask the solver, return its answer.", "Solve one Reasoning Gym question.",
        "A harness for reasoning questions.")
COMMENTS = ("", "", "One question in, one answer out.", "The solver is a frozen LLM.")


@dataclasses.dataclass(frozen=True)
class Variant:
    """A reasoning harness; the defaults render the seed harness byte for byte."""

    question: str = "question"
    reply: str = "reply"
    prompt: str = "prompt"
    docstring: str = SEED_DOC  # "" for none.
    comment: str = ""  # A comment line at the top of solve ("" for none).
    fixes: tuple[str, ...] = ()  # Fix kinds it carries, in the order they were added.
    inline: bool = True  # Without fixes: one `return solver.generate(...)` line, as the seed.

    def __post_init__(self):
        unknown = [k for k in self.fixes if k not in KINDS]
        if unknown or len(set(self.fixes)) != len(self.fixes):
            raise ValueError(f"fixes must be distinct kinds of {KINDS}, got {self.fixes}")

    def with_fix(self, kind: str) -> Variant:
        if kind in self.fixes:
            raise ValueError(f"the harness already carries the {kind} fix")
        return dataclasses.replace(self, fixes=self.fixes + (kind,))


def render(v: Variant) -> str:
    """The harness source of `v`."""
    q, r, fixes = v.question, v.reply, set(v.fixes)
    lines = [f'"""{v.docstring}"""', "", ""] if v.docstring else []
    lines.append(f"def solve({q}: str, solver) -> str:")
    if v.comment:
        lines.append(f"    # {v.comment}")
    if not fixes and v.inline:
        lines.append(f"    return solver.generate({q}).strip()")
        return "\n".join(lines) + "\n"
    tokens = ", max_new_tokens=1024" if "truncation" in fixes else ""
    source = q
    if "format" in fixes:
        lines.append(f"    {v.prompt} = {q} + {FORMAT_TEXT}")
        source = v.prompt
    final = source
    if "careless" in fixes:
        lines.append(f"    draft = solver.generate({source}{tokens})")
        final = f"{source} + {CHECK_TEXT}"
    if "variance" in fixes:
        lines.append(f"    samples = solver.generate_batch([{final}] * 5, temperature=1.0{tokens})")
        lines.append(f"    {r} = max(set(samples), key=samples.count)")
    else:
        lines.append(f"    {r} = solver.generate({final}{tokens})")
    if "buried" in fixes:
        lines.append(f'    {r} = {r}.split("\\n\\nP.S.")[0]')
    lines.append(f"    return {r}.strip()")
    return "\n".join(lines) + "\n"


# A fix's text in any harness `render` writes, whatever its names and layout (`fixes_in`).
SIGNATURES = {
    "format": FORMAT_TEXT,
    "truncation": "max_new_tokens=1024",
    "careless": CHECK_TEXT,
    "variance": "] * 5, temperature=1.0",
    "buried": '.split("\\n\\nP.S.")[0]',
}


def fixes_in(code: str) -> set[str]:
    """The fix kinds whose text `code` holds: what a proposal added is fixes_in(child) - fixes_in(parent)."""
    return {kind for kind, text in SIGNATURES.items() if text in code}


def edit_between(old: str, new: str) -> str:
    """One SEARCH/REPLACE block turning `old` into `new`: the changed lines, widened by a line at a
    time until the SEARCH text is non-empty and found once in `old`."""
    a, b = old.splitlines(), new.splitlines()
    if a == b:
        raise ValueError("nothing to edit: the two harnesses are the same")
    start = 0
    while start < min(len(a), len(b)) and a[start] == b[start]:
        start += 1
    end = 0
    while end < min(len(a), len(b)) - start and a[-1 - end] == b[-1 - end]:
        end += 1
    lo, hi_a, hi_b = start, len(a) - end, len(b) - end
    while True:
        search = "\n".join(a[lo:hi_a])
        if search.strip() and old.count(search) == 1:
            break
        if lo > 0:
            lo -= 1
        elif hi_a < len(a):
            hi_a, hi_b = hi_a + 1, hi_b + 1
        else:
            raise ValueError("no unique span covers the change")
    replace = "\n".join(b[lo:hi_b])
    return f"{edits.SEARCH}\n{search}\n{edits.DIVIDER}\n{replace}\n{edits.REPLACE}"


def quote(report: str, words: int = 6) -> str:
    """What the first answer (or exception) a rendered execution report shows starts and ends with:
    its first and last `words` words, on one line."""
    lines = report.splitlines()
    for i, line in enumerate(lines):
        for head in ("Harness answer: ", "Exception: "):
            if line.startswith(head):
                body = [line[len(head):]]
                for more in lines[i + 1:]:  # An answer runs on until the report's next field.
                    if more.startswith(_FIELDS) or _MARKER.match(more):
                        break
                    body.append(more)
                said = " ".join(" ".join(body).split())
                parts = said.split(" ")
                if len(parts) > 2 * words:
                    said = " ".join(parts[:words]) + " ... " + " ".join(parts[-words:])
                return head + said
    return "no answers."


# Lines that start a new field of a question in a rendered report (hljax/harness/report.py).
_FIELDS = ("Exception: ", "Traceback", "What happened: ", "The answer could not be scored", "stdout (end):",
           "stderr (end):", "Solver calls: ", "### Question")
_MARKER = re.compile(r"\[(\d+ more questions not shown|report cut to fit)\]")


def fix_completion(v: Variant, kind: str, report: str | None = None) -> str:
    """The proposer answer adding fix `kind` to harness `v`: with a rendered `report`, first a line
    quoting what it shows (`quote`), then the fix's note, then the edit."""
    seen = "" if report is None else f"The report shows: {quote(report)}\n"
    return f"{seen}{NOTES[kind]}\n\n{edit_between(render(v), render(v.with_fix(kind)))}\n"


def random_variant(rng: random.Random, max_fixes: int = 2, names: bool = True) -> Variant:
    """A harness with 1..max_fixes fixes already carried, or none in a multi-line layout; with
    `names`, random names, docstring and comment too. A name the harness does not show yet (the
    prompt variable before the format fix, the reply variable of the one-line layout) stays the
    default one, the name a fix introduces: what the proposer must write can be read off its prompt."""
    fixes = tuple(rng.sample(KINDS, rng.randint(0, max_fixes)))
    inline = not fixes and rng.random() < 0.5
    if not names:
        return Variant(fixes=fixes, inline=inline)
    return Variant(question=rng.choice(QUESTION_NAMES), reply="reply" if inline else rng.choice(REPLY_NAMES),
                   prompt=rng.choice(PROMPT_NAMES) if "format" in fixes else "prompt", docstring=rng.choice(DOCS),
                   comment=rng.choice(COMMENTS), fixes=fixes, inline=inline)
