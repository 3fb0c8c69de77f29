"""Results tables laid out like the paper's: one row per proposer (the seed harness first), one
column per task, the mean last; written as Markdown and CSV. Pure functions over result rows."""

from __future__ import annotations

import csv
import dataclasses
import io
import math
from typing import Sequence


@dataclasses.dataclass(frozen=True)
class TaskResult:
    """One proposer on one task."""

    label: str  # "seed" for the seed harness row.
    task: str
    mean: float  # Mean held-out score over proposals (single) or over runs' final harnesses (rounds).
    oracle: float  # Best proposal's held-out score (single) or best run (rounds); an oracle, not achievable.
    proposals: int  # Proposals behind `mean`.
    invalid_rate: float  # Share of proposals whose edit gave no harness.
    zero_rate: float  # Share of proposals scoring 0 on the held-out questions (invalid ones included).
    per_round: tuple[float, ...] = ()  # rounds protocol: mean held-out score of the kept harness after round t (t=0: seed).


def _fmt(x: float) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"


def _grid(results: Sequence[TaskResult], field: str) -> tuple[list[str], list[str], dict]:
    labels = list(dict.fromkeys(r.label for r in results))
    if "seed" in labels:
        labels.remove("seed")
        labels.insert(0, "seed")
    tasks = list(dict.fromkeys(r.task for r in results))
    cells = {(r.label, r.task): getattr(r, field) for r in results}
    return labels, tasks, cells


def _row_mean(cells: dict, label: str, tasks: Sequence[str]) -> float:
    values = [cells[(label, t)] for t in tasks if (label, t) in cells]
    return sum(values) / len(values) if len(values) == len(tasks) and values else float("nan")


def score_table(results: Sequence[TaskResult], field: str = "mean", title: str = "") -> str:
    """Markdown: rows = proposers (seed first), columns = tasks + mean over tasks."""
    labels, tasks, cells = _grid(results, field)
    lines = [f"**{title}**", ""] if title else []
    lines.append("| proposer | " + " | ".join(tasks) + " | mean |")
    lines.append("|---" * (len(tasks) + 2) + "|")
    for label in labels:
        row = [_fmt(cells.get((label, t), float("nan"))) for t in tasks]
        lines.append(f"| {label} | " + " | ".join(row) + f" | {_fmt(_row_mean(cells, label, tasks))} |")
    return "\n".join(lines) + "\n"


def rates_table(results: Sequence[TaskResult]) -> str:
    """Markdown: per proposer, proposals, invalid and zero-score rates pooled over tasks."""
    lines = ["| proposer | proposals | invalid rate | zero-score rate |", "|---|---|---|---|"]
    for label in dict.fromkeys(r.label for r in results):
        if label == "seed":
            continue
        rows = [r for r in results if r.label == label]
        n = sum(r.proposals for r in rows)
        invalid = sum(r.invalid_rate * r.proposals for r in rows) / n if n else float("nan")
        zero = sum(r.zero_rate * r.proposals for r in rows) / n if n else float("nan")
        lines.append(f"| {label} | {n} | {_fmt(invalid)} | {_fmt(zero)} |")
    return "\n".join(lines) + "\n"


def rounds_table(results: Sequence[TaskResult]) -> str:
    """Markdown: per proposer, the held-out score of the kept harness after each round, mean over tasks."""
    rows = [r for r in results if r.per_round]
    if not rows:
        return ""
    width = max(len(r.per_round) for r in rows)
    lines = ["| proposer | " + " | ".join(["seed"] + [f"round {t}" for t in range(1, width)]) + " |",
             "|---" * (width + 1) + "|"]
    for label in dict.fromkeys(r.label for r in rows):
        mine = [r.per_round for r in rows if r.label == label]
        means = [sum(p[t] for p in mine) / len(mine) for t in range(width)]
        lines.append(f"| {label} | " + " | ".join(_fmt(m) for m in means) + " |")
    return "\n".join(lines) + "\n"


def to_csv(results: Sequence[TaskResult], solver: str = "") -> str:
    """One row per (proposer, task); `solver` (who answered the harnesses' calls) on every row, so a
    row read alone still says when the scores are the simulated solver's."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["proposer", "task", "mean", "oracle", "proposals", "invalid_rate", "zero_rate", "per_round",
                     "solver"])
    for r in results:
        writer.writerow([r.label, r.task, f"{r.mean:.6f}", f"{r.oracle:.6f}", r.proposals, f"{r.invalid_rate:.6f}",
                         f"{r.zero_rate:.6f}", " ".join(f"{x:.6f}" for x in r.per_round), solver])
    return out.getvalue()


def results_markdown(results: Sequence[TaskResult], protocol: str, notes: Sequence[str] = ()) -> str:
    if protocol == "single":
        parts = [score_table(results, "mean", "Held-out score, mean over all proposals (headline)"),
                 score_table([r for r in results if r.label != "seed"], "oracle",
                             "Oracle best-of-N: the best proposal chosen on held-out scores (not achievable)")]
    else:
        parts = [score_table(results, "mean", "Held-out score of the final harness, mean over runs"),
                 rounds_table(results),
                 score_table([r for r in results if r.label != "seed"], "oracle",
                             "Oracle: best run's final harness, chosen on held-out scores (not achievable)")]
    parts.append(rates_table(results))
    body = "\n".join(p for p in parts if p)
    return body + ("\n" + "\n".join(f"- {n}" for n in notes) + "\n" if notes else "")
