"""Static HTML reports of revision runs: one self-contained page per task, and an index for many.

A page shows the revision tree (seed -> candidates, the selected path highlighted), each candidate's
edit as a coloured unified diff against its parent, the raw completion and failure of invalid
edits, the execution report (and, with prompt.history on, the history) the proposer saw, and a PNG of scores per round (embedded as a data
URI and written beside the page). No server, no JavaScript, no network: open the file.

Harness code, completions, reports and failure details are untrusted model output: every piece of
text goes through `html.escape` before it reaches the page.
"""

from __future__ import annotations

import base64
import dataclasses
import difflib
import html
import html.parser
import json
import os
from typing import Mapping, Sequence

from hljax.loop.records import SEED_ID, CandidateRecord, RoundRecord, read_run
from hljax.loop.rewards import RUN_KINDS
_SUMMARY_META = "hljax-summary"  # <meta> carrying the page's summary as JSON, read by `write_index`.


def _e(text) -> str:
    return html.escape(str(text), quote=True)


def is_valid(c: CandidateRecord) -> bool:
    """The edit parsed and applied (the harness may still have crashed)."""
    return c.kind in RUN_KINDS


def _fmt(score: float | None) -> str:
    return "-" if score is None else f"{score:.3f}"


# ----- what the records say -----------------------------------------------------------------------


def kept_scores(rounds: Sequence[RoundRecord]) -> list[float | None]:
    """Per round, the score of the harness carried into the next round, on that round's scoring set.

    None when the record has no `selected_score` and the selected harness is neither the round's
    parent nor one of its candidates (an older front member)."""
    out = []
    for r in rounds:
        if r.selected_score is not None:
            out.append(r.selected_score)
            continue
        by_id = {c.id: c.score for c in r.candidates}
        by_id.setdefault(r.parent, r.parent_score)
        out.append(by_id.get(r.selected))
    return out


def selected_path(rounds: Sequence[RoundRecord], parents: Mapping[str, str]) -> list[str]:
    """Ids from the seed to the last round's selected harness, following parent links."""
    node = rounds[-1].selected if rounds else SEED_ID
    path = [node]
    while node != SEED_ID and node in parents:
        node = parents[node]
        path.append(node)
    return path[::-1]


@dataclasses.dataclass(frozen=True)
class Summary:
    task: str
    rounds: int
    seed_score: float | None  # The seed's score on round 0's scoring set (None before any round).
    final_id: str
    final_score: float | None  # The last selected harness's score on the last round's scoring set.
    best_id: str
    best_score: float | None  # Highest score any harness reached on its round's scoring set.
    candidates: int
    valid: int  # Edits that applied (ran, crashed or infra error).
    invalid: int
    ran: int
    crashed: int
    infra_error: int
    scored_on: str = "scoring"  # The questions the scores above are on: "scoring", or "eval" (single step).
    scoring_questions: int = 0
    # Held-out (eval split) scores from the run's eval.json, the figures results.md and the console show:
    # the seed's, and the final harness's (rounds) or the mean over proposals, invalid ones 0 (single step).
    held_out_seed: float | None = None
    held_out_final: float | None = None
    held_out_questions: int = 0
    proposer: str = ""
    solver: str = ""


def summarize(task: str, rounds: Sequence[RoundRecord], held_out: Mapping[str, Sequence[float]] | None = None,
              proposer: str = "", solver: str = "") -> Summary:
    cands = [c for r in rounds for c in r.candidates]
    seed_score = next((r.parent_score for r in rounds if r.parent == SEED_ID), None)
    best_id, best = (SEED_ID, seed_score)
    for r in rounds:
        for hid, s in [(r.parent, r.parent_score)] + [(c.id, c.score) for c in r.candidates if is_valid(c)]:
            if best is None or s > best:
                best_id, best = hid, s
    kinds = [c.kind for c in cands]
    final_id = rounds[-1].selected if rounds else SEED_ID
    scored_on = rounds[0].scored_on if rounds else "scoring"
    seed_held = final_held = None
    n_held = 0
    if held_out:
        mean = lambda xs: sum(xs) / len(xs) if xs else 0.0  # noqa: E731
        seed_held = mean(held_out[SEED_ID]) if SEED_ID in held_out else None
        n_held = len(next(iter(held_out.values())))
        if scored_on == "eval":  # Single step: the candidates were scored on the held-out questions.
            final_held = mean([c.score if c.has_code else 0.0 for c in cands])
        elif final_id in held_out:
            final_held = mean(held_out[final_id])
    return Summary(
        task=task, rounds=len(rounds), seed_score=seed_score, final_id=final_id,
        final_score=kept_scores(rounds)[-1] if rounds else None,
        best_id=best_id, best_score=best, candidates=len(cands),
        valid=sum(is_valid(c) for c in cands), invalid=sum(not is_valid(c) for c in cands),
        ran=kinds.count("ran"), crashed=kinds.count("crashed"), infra_error=kinds.count("infra_error"),
        scored_on=scored_on, scoring_questions=len(rounds[0].parent_scores) if rounds else 0,
        held_out_seed=seed_held, held_out_final=final_held, held_out_questions=n_held,
        proposer=proposer, solver=solver,
    )


# ----- the plot -----------------------------------------------------------------------------------


def plot_scores(rounds: Sequence[RoundRecord], png_path: str, ylabel: str = "score") -> str:
    """Score of the kept harness per round, every candidate as a point, and the invalid-edit rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax_bad) = plt.subplots(2, 1, figsize=(7.0, 4.6), sharex=True, height_ratios=(3, 1))
    if rounds:
        xs = [r.round for r in rounds]
        ax.plot(xs, [r.parent_score for r in rounds], ls="--", marker=".", color="0.5", label="parent")
        kept = [float("nan") if k is None else k for k in kept_scores(rounds)]
        ax.plot(xs, kept, marker="o", lw=2, color="C0", label="kept (selected)")
        # Crashed and invalid candidates all score 0: shifted sideways so neither hides the other.
        for label, pick, dx, style in (
                ("candidate (ran)", lambda c: c.kind == "ran", 0.0, dict(color="C2", marker="o")),
                ("candidate (crashed/infra)", lambda c: c.kind in RUN_KINDS[1:], -0.08, dict(color="C1", marker="s")),
                ("candidate (invalid edit)", lambda c: not is_valid(c), 0.08, dict(color="C3", marker="x"))):
            pts = [(r.round + dx, c.score) for r in rounds for c in r.candidates if pick(c)]
            if pts:
                px, py = zip(*pts)
                ax.scatter(px, py, s=22, alpha=0.7, label=label, **style)
        rate = [sum(not is_valid(c) for c in r.candidates) / max(1, len(r.candidates)) for r in rounds]
        ax_bad.bar(xs, rate, color="C3", alpha=0.7)
        ax_bad.set_xticks(xs)
        ax.legend(fontsize=7, loc="best")
    else:
        ax.text(0.5, 0.5, "no finished rounds", ha="center", va="center", transform=ax.transAxes)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax_bad.set_ylabel("invalid rate")
    ax_bad.set_ylim(0, 1)
    ax_bad.set_xlabel("round")
    ax_bad.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
    return png_path


# ----- HTML pieces --------------------------------------------------------------------------------

_CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #1f2328; max-width: 1200px; }
h1 { font-size: 1.5em; } h2 { border-bottom: 1px solid #d0d7de; padding-bottom: .2em; }
table { border-collapse: collapse; margin: .5em 0; } td, th { border: 1px solid #d0d7de; padding: 2px 8px; }
th { background: #f6f8fa; text-align: left; }
pre { background: #f6f8fa; padding: .6em; overflow-x: auto; font-size: 12px; white-space: pre-wrap; }
pre.diff { white-space: pre; line-height: 1.35; }
.line { display: block; }
.add { background: #dafbe1; color: #116329; } .del { background: #ffebe9; color: #82071e; }
.ctx { color: #6e7781; } .hunk { color: #0550ae; background: #ddf4ff; } .hdr { color: #57606a; font-weight: bold; }
.kind { border-radius: 3px; padding: 0 4px; font-size: 11px; color: white; }
.kind-ran { background: #1a7f37; } .kind-crashed { background: #bc4c00; } .kind-infra_error { background: #6e7781; }
.kind-invalid { background: #cf222e; }
#tree ul { list-style: none; margin: 0; padding-left: 1.4em; border-left: 1px dashed #d0d7de; }
#tree > ul { border-left: none; padding-left: 0; }
.node { margin: 2px 0; } .node > .label { padding: 1px 4px; border-radius: 3px; }
.on-path > .label { background: #fff8c5; outline: 1px solid #d4a72c; font-weight: bold; }
.candidate { margin: .6em 0 1.2em 0; padding-left: .8em; border-left: 3px solid #d0d7de; }
.candidate.selected { border-left-color: #d4a72c; }
.detail { background: #ffebe9; }
"""


def _kind_badge(kind: str) -> str:
    cls = kind if kind in RUN_KINDS else "invalid"
    return f'<span class="kind kind-{cls}">{_e(kind)}</span>'


def diff_lines(old: str, new: str, old_name: str, new_name: str) -> list[tuple[str, str]]:
    """(css class, text) per line of the unified diff from `old` to `new`."""
    out = []
    for line in difflib.unified_diff(old.splitlines(), new.splitlines(), old_name, new_name, lineterm=""):
        if line.startswith(("---", "+++")):
            cls = "hdr"
        elif line.startswith("@@"):
            cls = "hunk"
        elif line.startswith("+"):
            cls = "add"
        elif line.startswith("-"):
            cls = "del"
        else:
            cls = "ctx"
        out.append((cls, line))
    return out


def _diff_html(old: str, new: str, old_name: str, new_name: str, cid: str) -> str:
    lines = diff_lines(old, new, old_name, new_name)
    if not lines:
        return '<p class="nodiff">(no change)</p>'
    body = "".join(f'<span class="line {cls}">{_e(text) or " "}</span>' for cls, text in lines)
    return f'<pre class="diff" data-id="{_e(cid)}">{body}</pre>'


def _tree_html(rounds: Sequence[RoundRecord], on_path: set[str], seed_score: float | None) -> str:
    children: dict[str, list[tuple[int, CandidateRecord]]] = {}
    for r in rounds:
        for c in r.candidates:
            children.setdefault(c.parent, []).append((r.round, c))
    selected = {r.selected for r in rounds}

    def node(hid: str, label: str) -> str:
        cls = "node on-path" if hid in on_path else "node"
        kids = "".join(node(c.id, f"round {t} · {_kind_badge(c.kind)} · score {_fmt(c.score)}"
                            + (" · selected" if c.id in selected else ""))
                       for t, c in children.get(hid, []))
        sub = f"<ul>{kids}</ul>" if kids else ""
        # ids are from our own records, but escaped anyway: a task may name harness files.
        return (f'<li class="{cls}" data-id="{_e(hid)}"><span class="label"><a href="#h-{_e(hid)}">'
                f"<code>{_e(hid)}</code></a> {label}</span>{sub}</li>")

    roots = [node(SEED_ID, f"seed · score {_fmt(seed_score)}")]
    known = {SEED_ID} | {c.id for r in rounds for c in r.candidates}
    # A parent no record created (records from a run resumed onto another seed, say) still shows its subtree.
    roots += [node(p, "(not in these records)") for p in children if p not in known]
    return f'<div id="tree"><ul>{"".join(roots)}</ul></div>'


def _candidate_html(c: CandidateRecord, r: RoundRecord, codes: Mapping[str, str]) -> str:
    cls = "candidate selected" if c.id == r.selected else "candidate"
    head = (f'<h4 id="h-{_e(c.id)}"><code>{_e(c.id)}</code> {_kind_badge(c.kind)} score {_fmt(c.score)}'
            f' · parent <a href="#h-{_e(c.parent)}"><code>{_e(c.parent)}</code></a>'
            + (" · <b>selected</b>" if c.id == r.selected else "") + "</h4>")
    parts = [head]
    if c.scores:
        parts.append(f'<p class="scores">per question: {_e(" ".join(f"{s:.2f}" for s in c.scores))}</p>')
    if c.detail:
        parts.append(f'<pre class="detail">{_e(c.detail)}</pre>')
    if c.has_code and c.id in codes and c.parent in codes:
        parts.append(_diff_html(codes[c.parent], codes[c.id], c.parent, c.id, c.id))
    elif c.has_code:
        parts.append(f'<p class="missing">harness file for {_e(c.id)} or its parent is missing</p>')
    if is_valid(c) and c.has_code:
        parts.append(f'<details><summary>proposer output</summary><pre class="completion">{_e(c.completion)}'
                     "</pre></details>")
    else:  # An invalid edit: the raw text is all there is to look at.
        parts.append(f'<p>proposer output (raw):</p><pre class="completion">{_e(c.completion)}</pre>')
    return f'<div class="{cls}" data-id="{_e(c.id)}">{"".join(parts)}</div>'


def _history_html(r: RoundRecord) -> str:
    """The history section the proposer saw this round (with prompt.history on), as text: it quotes
    harness code and failure details, so it is escaped like every other piece of model output."""
    if not r.history:
        return ""
    return ('<details class="history"><summary>history shown to the proposer (earlier candidates)</summary>'
            f'<pre class="history">{_e(r.history)}</pre></details>')


def _round_html(r: RoundRecord, codes: Mapping[str, str]) -> str:
    n_bad = sum(not is_valid(c) for c in r.candidates)
    rows = "".join(
        f'<tr><td><a href="#h-{_e(c.id)}"><code>{_e(c.id)}</code></a></td><td>{_kind_badge(c.kind)}</td>'
        f"<td>{_fmt(c.score)}</td><td>{'yes' if c.id == r.selected else ''}</td>"
        f"<td>{'yes' if c.id in r.front else ''}</td></tr>"
        for c in r.candidates)
    return (
        f'<section class="round" id="round-{r.round}"><h2>Round {r.round}</h2>'
        f'<p>parent <a href="#h-{_e(r.parent)}"><code>{_e(r.parent)}</code></a>: score {_fmt(r.parent_score)}'
        f" (feedback {_fmt(r.feedback_score)}) · selected <code>{_e(r.selected)}</code>"
        f" ({_fmt(kept_scores([r])[0])}) · front {_e(', '.join(r.front) or '-')}"
        f" · {len(r.candidates)} candidates, {n_bad} invalid · {r.seconds:.1f} s</p>"
        f"<table><tr><th>id</th><th>kind</th><th>score</th><th>selected</th><th>front</th></tr>{rows}</table>"
        f"<details><summary>execution report shown to the proposer</summary>"
        f'<pre class="report">{_e(r.report)}</pre></details>'
        + _history_html(r)
        + "".join(_candidate_html(c, r, codes) for c in r.candidates) + "</section>")


def write_report(run_dir: str, out_path: str | None = None, title: str = "", proposer: str = "",
                 solver: str = "") -> str:
    """Write one task's static HTML page (and its scores PNG beside it); returns the page's path.
    `proposer` and `solver` say who made the figures (the solver "simulated ..." when it is the stand-in)."""
    seed, rounds, codes = read_run(run_dir)
    out_path = out_path or os.path.join(run_dir, "report.html")
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    task = rounds[0].task if rounds else os.path.basename(os.path.normpath(run_dir))
    title = title or f"hljax revision run: {task}"
    s = summarize(task, rounds, read_held_out(run_dir), proposer, solver)
    parents = {c.id: c.parent for r in rounds for c in r.candidates}
    on_path = set(selected_path(rounds, parents))

    on = _questions_label(s)
    png = plot_scores(rounds, os.path.splitext(out_path)[0] + "_scores.png", f"score on {on}")
    with open(png, "rb") as f:
        png_uri = "data:image/png;base64," + base64.b64encode(f.read()).decode("ascii")

    held = ("" if s.held_out_questions == 0 else
            f"seed {_fmt(s.held_out_seed)} → " + ("mean over proposals " if s.scored_on == "eval" else "final harness ")
            + f"{_fmt(s.held_out_final)} ({s.held_out_questions} eval-split questions; the figure results.md shows)")
    summary_rows = [
        ("task", _e(task)), ("proposer", _e(s.proposer or "-")), ("solver", _e(s.solver or "-")),
        ("held-out score", held or "not scored"),
        ("scores below are on", _e(on)),
        ("rounds", s.rounds), ("seed score (round 0)", _fmt(s.seed_score)),
        ("final harness", f"<code>{_e(s.final_id)}</code> {_fmt(s.final_score)}"),
        ("best score seen", f"<code>{_e(s.best_id)}</code> {_fmt(s.best_score)}"),
        ("candidates", f"{s.candidates}: {s.valid} valid edits ({s.ran} ran, {s.crashed} crashed, "
                       f"{s.infra_error} infra errors), {s.invalid} invalid edits"),
        ("selected path", " → ".join(f"<code>{_e(h)}</code>" for h in selected_path(rounds, parents))),
    ]
    seed_section = (f'<section id="seed"><h2 id="h-{SEED_ID}">Seed harness</h2>'
                    f'<pre class="code">{_e(seed)}</pre></section>')
    final_code = codes.get(s.final_id)
    final_section = "" if final_code is None or s.final_id == SEED_ID else (
        f'<section id="final"><h2>Final harness <code>{_e(s.final_id)}</code></h2>'
        f"<details><summary>code</summary><pre class=\"code\">{_e(final_code)}</pre></details></section>")
    page = (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f'<meta name="{_SUMMARY_META}" content="{_e(json.dumps({**dataclasses.asdict(s), "title": title}))}">'
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{_e(title)}</h1>"
        '<table id="summary">' + "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in summary_rows) + "</table>"
        f'<h2>Scores per round</h2><img id="scores" alt="scores per round" src="{png_uri}">'
        f"<h2>Revision tree</h2>{_tree_html(rounds, on_path, s.seed_score)}"
        + seed_section + "".join(_round_html(r, codes) for r in rounds) + final_section
        + "</body></html>\n")
    tmp = out_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(page)
    os.replace(tmp, out_path)
    return out_path


# ----- index --------------------------------------------------------------------------------------


class _MetaReader(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.summary: dict | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "meta" and a.get("name") == _SUMMARY_META:
            self.summary = json.loads(a["content"])


def read_summary(page_path: str) -> dict:
    """The summary a page written by `write_report` carries in its <meta> tag."""
    reader = _MetaReader()
    with open(page_path, encoding="utf-8") as f:
        reader.feed(f.read())
    if reader.summary is None:
        raise ValueError(f"{page_path} is not an hljax report page (no {_SUMMARY_META} meta tag)")
    return reader.summary


def read_held_out(run_dir: str) -> dict[str, list[float]] | None:
    """Per-harness held-out scores of a run (its eval.json, hljax/loop/evaluate.py), if it has them."""
    path = os.path.join(run_dir, "eval.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)["scores"]


def _questions_label(s: Summary) -> str:
    if s.scored_on == "eval":
        return f"the {s.scoring_questions} held-out (eval split) questions"
    return f"the run's {s.scoring_questions} scoring questions (not held out)"


def write_index(paths: Sequence[str], out: str, title: str = "hljax revision runs") -> str:
    """A page with one row per task report in `paths`, linking to it, with its held-out scores (the
    figures of results.md and the console) and its scores on the run's own scoring questions."""
    base = os.path.dirname(os.path.abspath(out))
    os.makedirs(base, exist_ok=True)
    rows, finals = [], {}
    summaries = [read_summary(p) for p in paths]
    for p, s in zip(paths, summaries):
        href = os.path.relpath(os.path.abspath(p), base).replace(os.sep, "/")
        if s.get("held_out_final") is not None:
            finals.setdefault(s.get("proposer", ""), []).append(s["held_out_final"])
        rows.append(
            # The run's title tells rows of one task apart (proposer label, with or without history).
            f'<tr><td><a href="{_e(href)}">{_e(s["task"])}</a></td><td class="run">{_e(s.get("title", ""))}</td>'
            f'<td>{s["rounds"]}</td><td>{_fmt(s.get("held_out_seed"))}</td>'
            f'<td class="final">{_fmt(s.get("held_out_final"))}</td>'
            f'<td>{_fmt(s["seed_score"])} → {_fmt(s["final_score"])}</td>'
            f'<td><code>{_e(s["final_id"])}</code></td><td>{s["valid"]}/{s["candidates"]}</td></tr>')
    single = any(s.get("scored_on") == "eval" for s in summaries)
    what = "mean over proposals (invalid ones 0)" if single else "the final harness"
    means = "".join(f"<li>{_e(label or 'proposer')}: {_fmt(sum(v) / len(v))} over {len(v)} task runs</li>"
                    for label, v in finals.items())
    solvers = sorted({s.get("solver", "") for s in summaries} - {""})
    head = (f"<p>Held-out score (eval split, disjoint from feedback and scoring questions) of {what}, mean over "
            f"tasks, as results.md and the console show it:</p><ul>{means}</ul>" if means else "")
    head += "".join(f"<p>solver: {_e(x)}</p>" for x in solvers)
    page = (
        f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{_e(title)}</title>"
        f"<style>{_CSS}</style></head><body><h1>{_e(title)}</h1>{head}"
        '<table id="index"><tr><th>task</th><th>run</th><th>rounds</th><th>seed, held out</th>'
        f"<th>{'proposals' if single else 'final'}, held out</th><th>seed → final, on the run's scoring questions</th>"
        "<th>final harness</th><th>valid edits</th></tr>" + "".join(rows) + "</table></body></html>\n")
    with open(out, "w", encoding="utf-8") as f:
        f.write(page)
    return out
