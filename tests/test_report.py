"""ExecutionReport: aggregates over results and the budgeted text rendering."""

import pytest

from hljax.harness.report import ExecutionReport
from sandbox.results import HarnessError, Job, JobResult

TRACEBACK = '  File "harness.py", line 3, in solve\n    return int(x)\nValueError: invalid literal\n'


def _report() -> ExecutionReport:
    jobs = [Job("code", f"question {i}", reference=f"ref{i}") for i in range(6)]
    results = [
        JobResult("", "ok", "ref0", 1.0, solver_calls=1, prompt_tokens=10, completion_tokens=5, run_s=0.1),
        JobResult(
            "", "ok", "nope", 0.0, scorer_error="ValueError: not a number", solver_calls=2, prompt_tokens=20,
            completion_tokens=10, stdout_tail="dbg\n",
        ),
        JobResult(
            "", "error", None, None, error=HarnessError("ValueError", "invalid literal", TRACEBACK), solver_calls=1
        ),
        JobResult("", "timeout", None, None, reason="ran past the 10s deadline and was killed"),
        JobResult("", "crashed", None, None, reason="killed by signal SIGSEGV", stderr_tail="Fatal\n"),
        JobResult("", "infra_error", None, None, reason="the Generator failed: ConnectionError"),
    ]
    return ExecutionReport.from_results(jobs, results)


def test_aggregates_exclude_infra_errors():
    r = _report()
    assert r.infra_errors == 1 and len(r.counted) == 5
    assert r.mean_score == pytest.approx(1.0 / 5)
    assert r.error_rate == pytest.approx(2 / 5)  # One raised, one crashed.
    assert r.timeout_rate == pytest.approx(1 / 5)


def test_full_render():
    text = _report().render(max_chars=100_000)
    assert text.startswith(
        "5 feedback questions: mean score 0.200; 1 raised, 1 crashed, 1 timed out "
        "(error rate 40%, timeout rate 20%); per question 0.8 solver calls, 9 tokens. "
        "1 more not run (sandbox or solver failure, not the harness's fault)."
    )
    # Failures first (in question order), then by ascending score; infra errors are not listed.
    order = [line.split(":")[0] for line in text.splitlines() if line.startswith("### Question")]
    assert order == ["### Question 3", "### Question 4", "### Question 5", "### Question 2", "### Question 1"]
    assert "### Question 3: error, score n/a\nQuestion: question 2\nReference answer: ref2\n" in text
    assert "Exception: ValueError: invalid literal\nTraceback (last frames):\n" + TRACEBACK.rstrip() in text
    assert "What happened: killed by signal SIGSEGV\nstderr (end):\nFatal\n" in text
    assert (
        "Harness answer: nope\nThe answer could not be scored (counted as 0): ValueError: not a number\n"
        "stdout (end):\ndbg\nSolver calls: 2 (20 prompt + 10 completion tokens)\n"
    ) in text
    assert "question 5" not in text  # The infra error.


def test_render_shrinks_detail_then_drops_questions_then_cuts():
    jobs = [Job("c", "Q" * 2000, reference="R" * 1000) for _ in range(10)]
    results = [JobResult("", "ok", "A" * 1000, 0.5, stdout_tail="o" * 3000) for _ in range(10)]
    report = ExecutionReport.from_results(jobs, results)
    full = report.render()
    assert "[1200 more chars]" in full  # Question cut to 800 of 2000 chars at the richest level.
    for budget in (30_000, 5_000, 1_200, 150, 40):
        text = report.render(max_chars=budget)
        assert len(text) <= budget
    lean = report.render(max_chars=5_000)  # Fits all ten at the leanest level (~420 chars each).
    assert lean.count("### Question") == 10 and "[1900 more chars]" in lean
    dropped = report.render(max_chars=2_500)
    shown = dropped.count("### Question")
    assert 0 < shown < 10 and dropped.endswith(f"[{10 - shown} more questions not shown]")
    assert report.render(max_chars=150).endswith("[report cut to fit]")


def test_render_with_token_budget():
    report = _report()
    words = lambda text: len(text.split())  # noqa: E731 - a stand-in tokenizer.
    text = report.render(max_tokens=60, count_tokens=words)
    assert words(text) <= 60 and text.startswith("5 feedback questions")
    with pytest.raises(ValueError, match="count_tokens"):
        report.render(max_tokens=10)


def test_mismatched_lengths_are_refused():
    with pytest.raises(ValueError, match="2 jobs but 1 results"):
        ExecutionReport.from_results([Job("c", "a"), Job("c", "b")], [JobResult("", "ok", "x", 1.0)])


def test_run_time_shown_only_in_whole_seconds_when_slow():
    # Sub-second jitter must not reach the proposer's prompt (a resumed run must see the same prompt).
    jobs = [Job("c", "q0", reference="r"), Job("c", "q1", reference="r")]
    results = [JobResult("", "ok", "a", 0.0, run_s=0.0123), JobResult("", "ok", "b", 0.0, run_s=2.4)]
    text = ExecutionReport.from_results(jobs, results).render()
    assert text.count("; time ") == 1 and "; time 2s" in text and "0.01" not in text
