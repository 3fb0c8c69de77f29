"""Answers attacking the scorer: reasoning-gym scorers that eval an answer run in the isolated scorer
process, never in the trusted one (issue 19, item 1).
"""

import time

import pytest

from reasoning_gym.games.n_queens import NQueensDataset

from hljax.tasks.formats import FORMATS
from hljax.tasks.jobs import make_jobs, make_scorer
from hljax.tasks.reasoning_gym import RGTaskConfig, ReasoningGymTask
from hljax.tasks.splits import SplitConfig
from sandbox.config import SandboxConfig
from sandbox.pool import SandboxPool
from sandbox.results import IsolatedScorer, Job, ScorerSpec
from tests._sandbox_fakes import EchoGenerator
from tests._sandbox_attack_kit import (  # noqa: F401 - `pool` is a fixture.
    needs_bwrap, pool, run_among_normals,
)

pytestmark = needs_bwrap


# ----- answers attacking the scorer -------------------------------------------------------------------

N_QUEENS_SCORER = NQueensDataset.score_answer  # As reasoning-gym defines it, before any test runs.


def answering(text: str) -> str:
    return f"def solve(question, solver):\n    return {text!r}\n"


def test_n_queens_answers_cannot_rewrite_forge_or_read_the_scorer(pool):
    """reasoning-gym's n_queens scorer eval()s answers that are not a listed solution."""
    task = ReasoningGymTask(RGTaskConfig("n_queens", splits=SplitConfig(seed=0, feedback_size=2)))
    q = task.feedback_round(0)[0]
    fmt, reference = FORMATS[q.payload.format], q.payload.entry["answer"]
    rewrite = 'setattr(type(self), "score_answer", lambda s, a, e: 1.0)'
    forge = "__import__('os').write(4, b'{\"value\": 1.0, \"error\": \"\"}') and __import__('os')._exit(0)"
    # Reads the reference out of the scorer's own frame and reports it as a scorer error.
    read = ("__import__('os').write(4, __import__('json').dumps({'value': 0.0, 'error': "
            "str(__import__('sys')._getframe(1).f_locals['entry']['answer'])}).encode()) and __import__('os')._exit(0)")
    codes = [answering(q.answer), answering(fmt.render(rewrite)), answering(fmt.render(forge)),
             answering(fmt.render(read)), answering(q.answer)]  # fmt: skip
    workers = pool.worker_pids
    honest, rewriter, forger, reader, honest2 = pool.run(
        [job for code in codes for job in make_jobs(task, code, [q])], make_scorer(task, [q]))
    assert [r.status for r in (honest, rewriter, forger, reader, honest2)] == ["ok"] * 5
    assert (honest.score, honest2.score) == (1.0, 1.0)
    assert (rewriter.score, forger.score, reader.score) == (0.0, 0.0, 0.0)
    # The scorer was not rewritten: a wrong answer that follows still scores 0, a right one 1.
    wrong, right = pool.run([*make_jobs(task, answering(fmt.render("[['Q']]")), [q]),
                             *make_jobs(task, answering(q.answer), [q])], make_scorer(task, [q]))
    assert (wrong.score, right.score) == (0.0, 1.0)
    assert NQueensDataset.score_answer is N_QUEENS_SCORER, "the trainer's scorer class was rewritten"
    assert task.score(fmt.render("[['Q']]"), q).value == 0.0
    for r in (rewriter, forger, reader, wrong):
        for text in (r.answer, r.scorer_error, r.reason, r.stdout_tail, r.stderr_tail):
            assert reference not in text and repr(reference)[1:-1] not in text, text
    assert pool.worker_pids == workers


def test_a_hanging_or_dying_scorer_scores_zero_and_the_batch_is_scored():
    config = SandboxConfig(workers=1, scorer_timeout_s=1.0, scorer_parallel=2, scorer_packages=("hljax", "tests"))
    answers = ["hang", "right", "spin", "wrong", "die", "right"]
    jobs = [Job(answering(a), "q", tag=f"q{i}") for i, a in enumerate(answers)]
    scorer = IsolatedScorer(ScorerSpec("tests._scorer_fakes:misbehaving_scorer"), {j.tag: "right" for j in jobs})
    with SandboxPool(config, EchoGenerator()) as p:
        p.run([jobs[1]], scorer)  # Starts the scorer process.
        scorer_pid = p.scorer_pid
        started = time.monotonic()
        results = p.run(jobs, scorer)
        elapsed = time.monotonic() - started
        assert [r.status for r in results] == ["ok"] * 6
        assert [r.score for r in results] == [0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
        for i in (0, 2):
            assert "ran past 1.0 s" in results[i].scorer_error
        assert "signal 9" in results[4].scorer_error
        assert results[1].scorer_error == results[3].scorer_error == ""
        assert elapsed < 10, elapsed  # Killed at the scorer timeout, the two in parallel.
        (again,) = p.run([jobs[1]], scorer)
        assert again.score == 1.0 and p.scorer_pid == scorer_pid, "the scorer process was replaced"


def test_scorer_audit_covers_every_listed_family():
    from hljax.tasks import rg_families

    listed = set(rg_families.SFT + rg_families.RL + rg_families.HELDOUT)
    assert set(rg_families.SCORER_AUDIT) == listed
    evaluating = {f for f, what in rg_families.SCORER_AUDIT.items() if what.startswith("EVAL")}
    assert evaluating == {"n_queens"}


@pytest.mark.parametrize(
    "code, check",
    [
        ("def solve(q, s):\n    return 'a\\ud800b\\udfff'\n", lambda r: r.answer == "a\ufffdb\ufffd"),
        ("def solve(q, s):\n    return s.generate('x\\udc80')\n", lambda r: r.answer == "echo:x\ufffd"),
        ("def solve(q, s):\n    raise ValueError('\\ud800')\n", lambda r: r.error.message == "\ufffd"),
    ],
)
def test_lone_surrogates_are_replaced_at_the_boundary(pool, code, check):
    r = run_among_normals(pool, code)
    assert r.status in ("ok", "error") and check(r), r
    for text in (r.answer or "", r.error.message if r.error else "", r.error.traceback if r.error else ""):
        text.encode("utf-8")  # What reports, logs and the Generator do with them.
