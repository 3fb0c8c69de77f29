"""launch.evaluate's comparison of a proposer with and without history (evaluation.compare_history):
`evaluate.run` end to end with a scripted proposer in place of a served model and the simulated
solver, then the table and the HTML report. Also: the report shows the history each round, escaped."""

import csv
import dataclasses
import io
import os

import pytest
import transformers

from configs import adapt_tiny
from hljax.config import ConfigError
from hljax import endpoints
from hljax.checkpoint.presets import TOKENIZER_DIR
from hljax.harness import history as hh
from hljax.loop import evaluate, html_report
from hljax.loop import records as rec
from hljax.loop.run_config import EvalRunConfig
from sandbox.isolation import bwrap_path as _bwrap_path
from tests.test_html_report import _check_untrusted_text_inert, _Dom
from tests.test_states import Proposer

pytestmark = pytest.mark.skipif(_bwrap_path() is None, reason="bwrap not installed (Debian package bubblewrap)")
TITLE = "## Earlier candidates in this run (oldest first)\n"


def _config(run_dir, **overrides):
    c = adapt_tiny.get_config()
    c.run_dir = str(run_dir)
    c.proposers = ("p=/scripted/export",)
    c.tasks.families = ("aiw",)
    c.adapt.rounds = 3
    c.sandbox.workers = 1
    c.sandbox.slots_per_worker = 4
    c.report.plots = False
    c.evaluation.compare_history = True
    c.prompt.history.mode = "last"
    for key, value in overrides.items():
        node, _, leaf = key.rpartition(".")
        setattr(c[node] if node else c, leaf, value)
    return EvalRunConfig.from_config(c)


class Recording(Proposer):
    """tests/test_states.py's proposer (a valid edit while the seed line is there), keeping every call."""

    def __init__(self):
        super().__init__()
        self.prompts = []
        # Its prompts' task descriptions are cut to adapt_tiny's token budget, as a served proposer's are.
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(TOKENIZER_DIR)

    def chat(self, conversations, sampling, **kw):
        self.prompts.append(conversations[0][-1]["content"])
        return super().chat(conversations, sampling, **kw)


def test_rows_with_and_without_history_share_seeds_and_questions(tmp_path, monkeypatch):
    cfg = _config(tmp_path / "eval")
    assert [r.label for r in cfg.rows()] == ["p", "p+history"]
    assert [r.prompt.history.mode for r in cfg.rows()] == ["off", "last"]
    proposer = Recording()
    real = endpoints.Endpoint

    class FakeEndpoint:
        """The simulated solver as configured; the scripted proposer in place of a served model."""

        def __init__(self, spec, mesh, name="server"):
            self.inner = real(spec, mesh, name=name) if spec.backend == "simulated" else None
            self.generator = self.inner.generator if self.inner else proposer

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            if self.inner:
                self.inner.close()

    monkeypatch.setattr(evaluate, "Endpoint", FakeEndpoint)
    summary = evaluate.run(cfg)

    # One proposer endpoint served both rows, plain first: the same sampling seeds, in the same order.
    half = len(proposer.seen) // 2
    assert half == cfg.adapt.rounds and [s.seed for s in proposer.seen[:half]] == [s.seed for s in proposer.seen[half:]]
    assert all(TITLE not in p for p in proposer.prompts[:half]) and all(TITLE in p for p in proposer.prompts[half:])
    # The same questions: feedback, scoring and held-out, round by round.
    runs = {label: rec.RunStore(os.path.join(cfg.run_dir, label, "rg_aiw", "run0")).rounds() for label in ("p", "p+history")}
    key = lambda rounds: [(r.feedback_qids, r.scoring_qids) for r in rounds]  # noqa: E731
    assert key(runs["p"]) == key(runs["p+history"])
    assert [r.history for r in runs["p"]] == ["", "", ""]
    assert runs["p+history"][0].history == hh.EMPTY and "### r0c0 (round 0, revised seed)" in runs["p+history"][1].history
    # The history in the record is the one in the prompt.
    assert all(r.history in p for r, p in zip(runs["p+history"], proposer.prompts[half:]))

    # One table with both rows (and the seed), saying which solver and prompt it was measured with.
    with open(summary["results_md"]) as f:
        md = f.read()
    assert "| p |" in md and "| p+history |" in md and "| seed |" in md
    assert "solver: simulated" in md and "rows '<proposer>+history'" in md
    rows = list(csv.DictReader(io.StringIO(open(summary["results_csv"]).read())))
    assert [r["proposer"] for r in rows] == ["seed", "p", "p+history"]
    # The HTML report of the +history run shows each round's history; the plain run's shows none.
    page = open(os.path.join(cfg.run_dir, "p+history", "rg_aiw", "run0", "report.html"), encoding="utf-8").read()
    shown = [n.all_text() for n in _Dom(page).root.find_all("pre", cls="history")]
    assert shown == [r.history for r in runs["p+history"]]
    plain = open(os.path.join(cfg.run_dir, "p", "rg_aiw", "run0", "report.html"), encoding="utf-8").read()
    assert not _Dom(plain).root.find_all("pre", cls="history")
    index = _Dom(open(summary["html"], encoding="utf-8").read()).root
    assert [n.all_text() for n in index.find_all("td", cls="run")] == [
        "p · rg/aiw · run0 · simulated solver", "p+history · rg/aiw · run0 · simulated solver"]


def test_compare_history_needs_the_history_section():
    with pytest.raises(ConfigError, match="compare_history needs prompt.history.mode"):
        _config("/tmp/x", **{"prompt.history.mode": "off"})
    with pytest.raises(ConfigError, match="must be unique"):
        _config("/tmp/x", proposers=("p=/a", "p+history=/b"))
    plain = _config("/tmp/x", **{"evaluation.compare_history": False})
    assert [(r.label, r.prompt) for r in plain.rows()] == [("p", plain.prompt)]


EVIL = "### r0c0\n</pre><script>document.body.setAttribute('data-pwned','h')</script>\n```diff\n+<b>x</b>\n```"


def test_report_shows_each_rounds_history_as_inert_text(tmp_path):
    store = rec.RunStore(str(tmp_path / "run"))
    store.put_harness("seed", "def solve(question, solver):\n    return solver(question)\n")
    c = rec.CandidateRecord("r0c0", "seed", "edit", "Unparseable", "no edit block", 0.0, (), False)
    r0 = rec.RoundRecord("t", 0, "seed", 0.1, (0.1,), 0.1, "report", (c,), "seed", ("seed",), 1.0, history=hh.EMPTY)
    store.append(r0)
    store.append(dataclasses.replace(r0, round=1, candidates=(dataclasses.replace(c, id="r1c0"),), history=EVIL))
    page = open(html_report.write_report(store.directory), encoding="utf-8").read()
    root = _Dom(page).root
    _check_untrusted_text_inert(root)
    assert [n.all_text() for n in root.find_all("pre", cls="history")] == [hh.EMPTY, EVIL]
    assert not any(n.children for n in root.find_all("pre", cls="history"))  # "<b>" stayed text.
