"""The HTML run report: structure checked with an HTML parser against hand-built records, escaping of
untrusted text, the scores plot, the index page, and the page as headless Chromium renders it."""

import base64
import html.parser
import json
import os
import shutil
import subprocess

import numpy as np
import pytest
from PIL import Image

from hljax.loop import html_report
from hljax.loop.records import CandidateRecord, RoundRecord, RunStore

SEED = "def solve(question, solver):\n    answer = solver(question)\n    return answer\n"
# r0c0: one line replaced by two (2 added, 1 removed in the diff).
R0C0 = ('def solve(question, solver):\n    prompt = "Think step by step. " + question\n'
        "    answer = solver(prompt)\n    return answer\n")
R0C0_ADDED = ['+    prompt = "Think step by step. " + question', "+    answer = solver(prompt)"]
# r0c2 carries markup in a string literal of the harness itself: it must show as text, never run.
R0C2 = ("def solve(question, solver):\n    x = \"<script>document.body.setAttribute('data-pwned','2')</script>\"\n"
        "    raise RuntimeError(x)\n")
R1C0 = R0C0.replace("return answer", "return answer.strip()")
R1C1 = R0C0.replace("return answer", "return answer.strip().splitlines()[-1]")
EVIL = "<<<<<<< SEARCH\n</pre><script>document.body.setAttribute('data-pwned','1')</script>\n=======\nx\n>>>>>>> REPLACE"

TREE = {"seed": None, "r0c0": "seed", "r0c1": "seed", "r0c2": "seed", "r1c0": "r0c0", "r1c1": "r0c0",
        "r2c0": "r1c1"}
SELECTED_PATH = {"seed", "r0c0", "r1c1"}


def _c(cid, parent, kind, score, scores=(), completion="edit", detail="", has_code=True):
    return CandidateRecord(cid, parent, completion, kind, detail, score, tuple(scores), has_code)


def _build_run(directory, task="word_sorting"):
    store = RunStore(str(directory))
    for hid, code in [("seed", SEED), ("r0c0", R0C0), ("r0c2", R0C2), ("r1c0", R1C0), ("r1c1", R1C1)]:
        store.put_harness(hid, code)
    rounds = [
        RoundRecord(task, 0, "seed", 0.4, (0.0, 1.0, 0.2), 0.3, "REPORT <b>round 0</b>",
                    (_c("r0c0", "seed", "ran", 0.6, (1.0, 0.5, 0.3)),
                     _c("r0c1", "seed", "SpanNotFound", 0.0, completion=EVIL,
                        detail="SEARCH block 1 <not found>", has_code=False),
                     _c("r0c2", "seed", "crashed", 0.0, (0.0, 0.0, 0.0))),
                    "r0c0", ("r0c0",), 12.5),
        RoundRecord(task, 1, "r0c0", 0.55, (0.5, 0.6, 0.55), 0.5, "report 1",
                    (_c("r1c0", "r0c0", "ran", 0.5, (0.5, 0.5, 0.5)), _c("r1c1", "r0c0", "ran", 0.7, (0.7, 0.7, 0.7))),
                    "r1c1", ("r1c1",), 10.0),
        RoundRecord(task, 2, "r1c1", 0.65, (0.6, 0.7, 0.65), 0.6, "report 2",
                    (_c("r2c0", "r1c1", "Unparseable", 0.0, completion="no blocks here", detail="no edit block",
                        has_code=False),),
                    "r1c1", ("r1c1",), 8.0),
    ]
    for r in rounds:
        store.append(r)
    return str(directory)


# ----- a small DOM from html.parser, for the written file and for Chromium's --dump-dom ---------------

_VOID = {"meta", "img", "br", "hr", "link", "input", "col", "area", "base", "source", "wbr"}


class _Node:
    def __init__(self, tag, attrs, parent):
        self.tag, self.attrs, self.parent, self.children, self.text = tag, dict(attrs), parent, [], []

    @property
    def classes(self):
        return set((self.attrs.get("class") or "").split())

    def iter(self):
        yield self
        for c in self.children:
            yield from c.iter()

    def find_all(self, tag=None, cls=None, **attrs):
        return [n for n in self.iter() if (tag is None or n.tag == tag) and (cls is None or cls in n.classes)
                and all(n.attrs.get(k.replace("_", "-")) == v for k, v in attrs.items())]

    def all_text(self):
        return "".join(self.text) + "".join(c.all_text() for c in self.children)


class _Dom(html.parser.HTMLParser):
    def __init__(self, text):
        super().__init__(convert_charrefs=True)
        self.root = self.cur = _Node("#root", [], None)
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        node = _Node(tag, attrs, self.cur)
        self.cur.children.append(node)
        if tag not in _VOID:
            self.cur = node

    def handle_endtag(self, tag):
        n = self.cur
        while n is not self.root and n.tag != tag:
            n = n.parent
        if n is not self.root:
            self.cur = n.parent

    def handle_data(self, data):
        # Text appended to the open element; `all_text` concatenates in document order per element only,
        # which is all the checks below need (each checked element holds text or spans, not both).
        self.cur.text.append(data)


def _tree_nodes(root):
    (tree,) = root.find_all("div", id="tree")
    return tree.find_all("li", cls="node")


def _parent_li(node):
    n = node.parent
    while n is not None and not (n.tag == "li" and "node" in n.classes):
        n = n.parent
    return n


def _diff_of(root, cid):
    diffs = root.find_all("pre", cls="diff", data_id=cid)
    assert len(diffs) == 1, f"expected one diff for {cid}, found {len(diffs)}"
    return diffs[0]


def _check_untrusted_text_inert(root):
    assert not root.find_all("script"), "a <script> element reached the page"
    assert not [n for n in root.iter() if "data-pwned" in n.attrs], "injected script ran"


# ----- tests --------------------------------------------------------------------------------------


@pytest.fixture
def report(tmp_path):
    run = _build_run(tmp_path / "word_sorting")
    page = html_report.write_report(run, str(tmp_path / "out" / "word_sorting.html"))
    return page, open(page, encoding="utf-8").read()


def test_report_tree_matches_records(report):
    _, text = report
    root = _Dom(text).root
    nodes = _tree_nodes(root)
    assert sorted(n.attrs["data-id"] for n in nodes) == sorted(TREE)
    for n in nodes:
        up = _parent_li(n)
        assert (up.attrs["data-id"] if up else None) == TREE[n.attrs["data-id"]]
    assert {n.attrs["data-id"] for n in nodes if "on-path" in n.classes} == SELECTED_PATH
    (meta,) = root.find_all("meta", name="hljax-summary")
    s = json.loads(meta.attrs["content"])
    assert (s["task"], s["rounds"], s["seed_score"]) == ("word_sorting", 3, 0.4)
    assert (s["final_id"], s["final_score"]) == ("r1c1", 0.65)  # Kept in round 2, scored as its parent.
    assert (s["best_id"], s["best_score"]) == ("r1c1", 0.7)
    assert (s["candidates"], s["valid"], s["invalid"], s["ran"], s["crashed"]) == (6, 4, 2, 3, 1)


def test_report_diffs_are_coloured_by_line_kind(report):
    root = _Dom(report[1]).root
    d = _diff_of(root, "r0c0")
    added = [n.all_text() for n in d.find_all("span", cls="add")]
    removed = [n.all_text() for n in d.find_all("span", cls="del")]
    assert added == R0C0_ADDED
    assert removed == ["-    answer = solver(question)"]
    assert [n.all_text() for n in d.find_all("span", cls="ctx")] == [" def solve(question, solver):",
                                                                       "     return answer"]
    assert len(d.find_all("span", cls="hdr")) == 2 and len(d.find_all("span", cls="hunk")) == 1
    d = _diff_of(root, "r1c1")
    assert [n.all_text() for n in d.find_all("span", cls="add")] == \
        ["+    return answer.strip().splitlines()[-1]"]
    # Invalid edits have no harness and so no diff; their raw text and failure show instead.
    assert not root.find_all("pre", cls="diff", data_id="r0c1")
    (box,) = root.find_all("div", cls="candidate", data_id="r0c1")
    assert [n.all_text() for n in box.find_all("pre", cls="completion")] == [EVIL]
    assert [n.all_text() for n in box.find_all("pre", cls="detail")] == ["SEARCH block 1 <not found>"]
    # The report each round's proposer saw, collapsed.
    reports = [n.all_text() for n in root.find_all("pre", cls="report")]
    assert reports == ["REPORT <b>round 0</b>", "report 1", "report 2"]
    assert all(_parent_tag(n, "details") for n in root.find_all("pre", cls="report"))


def _parent_tag(node, tag):
    n = node.parent
    while n is not None and n.tag != tag:
        n = n.parent
    return n


def test_untrusted_text_is_escaped(report):
    _, text = report
    assert "<script" not in text.lower()  # The page has no script of its own, and none of the model's.
    assert "&lt;script&gt;document.body.setAttribute(&#x27;data-pwned&#x27;,&#x27;1&#x27;)" in text
    root = _Dom(text).root
    _check_untrusted_text_inert(root)
    (d,) = [_diff_of(root, "r0c2")]
    assert any("<script>" in n.all_text() for n in d.find_all("span", cls="add"))
    assert not any(n.children for n in root.find_all("pre", cls="report"))  # The report's "<b>" stayed text.


def test_scores_plot_written_and_embedded(report, tmp_path):
    page, text = report
    png = os.path.splitext(page)[0] + "_scores.png"
    (img,) = _Dom(text).root.find_all("img", id="scores")
    prefix = "data:image/png;base64,"
    assert img.attrs["src"].startswith(prefix)
    assert base64.b64decode(img.attrs["src"][len(prefix):]) == open(png, "rb").read()
    pixels = np.asarray(Image.open(png).convert("RGB"))
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 20  # Lines, points and text, not a blank canvas.
    empty = html_report.plot_scores([], str(tmp_path / "empty.png"))  # A run with no finished round yet.
    assert Image.open(empty).size[0] > 0


def test_report_of_run_without_rounds(tmp_path):
    store = RunStore(str(tmp_path / "fresh"))
    store.put_harness("seed", SEED)
    root = _Dom(open(html_report.write_report(store.directory), encoding="utf-8").read()).root
    assert [n.attrs["data-id"] for n in _tree_nodes(root)] == ["seed"]


def test_index_links_each_task_with_its_held_out_scores(tmp_path):
    """The index leads with the held-out figures results.md shows (from each run's eval.json), per
    proposer, and labels the scores on the run's own scoring questions as such (issue 38)."""
    runs = [_build_run(tmp_path / t, task=t) for t in ("word_sorting", "<i>evil task</i>")]
    for run, final in zip(runs, ([0.5, 1.0], [0.0, 0.25])):
        with open(os.path.join(run, "eval.json"), "w") as f:
            json.dump({"qids": ["a", "b"], "scores": {"seed": [0.0, 0.5], "r1c1": final}}, f)
    pages = [html_report.write_report(run, str(tmp_path / "pages" / f"{i}.html"), proposer="rl", solver="simulated solver")
             for i, run in enumerate(runs)]
    out = html_report.write_index(pages, str(tmp_path / "index.html"))
    text = open(out, encoding="utf-8").read()
    root = _Dom(text).root
    (table,) = root.find_all("table", id="index")
    links = table.find_all("a")
    assert [a.all_text() for a in links] == ["word_sorting", "<i>evil task</i>"]
    for a, page in zip(links, pages):
        assert os.path.samefile(os.path.join(tmp_path, a.attrs["href"]), page)
    assert [n.all_text() for n in table.find_all("td", cls="final")] == ["0.750", "0.125"]
    assert "rl: 0.438 over 2 task runs" in text and "solver: simulated solver" in text
    assert "0.400 → 0.650" in text and "on the run's scoring questions" in text
    page = open(pages[0], encoding="utf-8").read()
    assert "seed 0.250 → final harness 0.750 (2 eval-split questions" in page
    assert "the run&#x27;s 3 scoring questions (not held out)" in page
    assert not root.find_all("i")  # The task name's markup stayed text.


# ----- the page in a real browser -----------------------------------------------------------------


def _chromium(args, tmp_path, timeout=90):
    exe = shutil.which("chromium")
    # CI installs chromium (.ci/run); a missing browser is a failure, not a skip.
    assert exe, "chromium is not on PATH: apt-get install chromium (see .ci/run)"
    cmd = [exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
           f"--user-data-dir={tmp_path / 'chromium-profile'}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def test_report_renders_in_headless_chromium(report, tmp_path):
    page, _ = report
    url = "file://" + os.path.abspath(page)
    out = _chromium(["--dump-dom", url], tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    root = _Dom(out.stdout).root
    # What the browser built matches the records: every harness a tree node, the edit's added lines.
    assert len(_tree_nodes(root)) == len(TREE)
    assert len(_diff_of(root, "r0c0").find_all("span", cls="add")) == len(R0C0_ADDED)
    _check_untrusted_text_inert(root)

    shot = tmp_path / "shot.png"
    out = _chromium([f"--screenshot={shot}", "--window-size=1200,2400", url], tmp_path)
    assert out.returncode == 0 and shot.exists(), out.stderr[-2000:]
    pixels = np.asarray(Image.open(shot).convert("RGB")).reshape(-1, 3)
    assert len(np.unique(pixels, axis=0)) > 50, "screenshot is blank"
    # The page's own colours are on screen: the selected-path highlight and the added-line green.
    for rgb in [(0xFF, 0xF8, 0xC5), (0xDA, 0xFB, 0xE1)]:
        assert (pixels == rgb).all(axis=1).sum() > 100, f"colour {rgb} not rendered"


def test_selected_older_front_member_has_no_kept_score(tmp_path):
    # A front policy may carry an older harness forward: this round's record has no score for it.
    store = RunStore(str(tmp_path / "front"))
    for hid, code in [("seed", SEED), ("r0c0", R0C0), ("r1c0", R1C0)]:
        store.put_harness(hid, code)
    store.append(RoundRecord("t", 0, "seed", 0.4, (), 0.4, "", (_c("r0c0", "seed", "ran", 0.6),), "r0c0",
                             ("r0c0",), 1.0))
    store.append(RoundRecord("t", 1, "r0c0", 0.5, (), 0.5, "", (_c("r1c0", "r0c0", "ran", 0.3),), "seed",
                             ("seed", "r0c0"), 1.0))
    assert html_report.kept_scores(store.rounds()) == [0.6, None]
    root = _Dom(open(html_report.write_report(store.directory), encoding="utf-8").read()).root
    s = json.loads(root.find_all("meta", name="hljax-summary")[0].attrs["content"])
    assert (s["final_id"], s["final_score"]) == ("seed", None)
    assert {n.attrs["data-id"] for n in _tree_nodes(root) if "on-path" in n.classes} == {"seed"}
