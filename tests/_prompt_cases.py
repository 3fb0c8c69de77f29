"""Fixed proposer-prompt cases: their messages under main's code (before prompt.history existed) are
stored in tests/data/prompts_golden.json, and with history off the prompt must still equal them."""

from hljax.harness import contract, prompts, seeds
from hljax.harness.report import ExecutionReport
from sandbox.results import HarnessError, Job, JobResult


def _report(n: int) -> ExecutionReport:
    jobs, results = [], []
    for i in range(n):
        jobs.append(Job("c", f"Question {i}: what is {i} + {i}? " + "context " * (i * 7), reference=str(2 * i)))
        kind = i % 4
        if kind == 0:
            results.append(JobResult(str(i), "ok", str(2 * i), 1.0, solver_calls=1, prompt_tokens=40, completion_tokens=3))
        elif kind == 1:
            results.append(JobResult(str(i), "ok", "wrong", 0.0, stdout_tail="thinking...\n" * i, solver_calls=2))
        elif kind == 2:
            results.append(JobResult(str(i), "error", None, None, error=HarnessError(
                "KeyError", "'x'", 'Traceback (most recent call last):\n  File "harness.py", line 3\nKeyError: \'x\'')))
        else:
            results.append(JobResult(str(i), "timeout", None, None, reason="ran past 30 s"))
    return ExecutionReport.from_results(jobs, results)


def cases():
    """(name, messages) for each fixed case."""
    words = lambda s: len(s.split())  # noqa: E731  A stand-in token count.
    out = [
        ("rg_default", prompts.proposer_messages("Solve reasoning puzzles.", seeds.load("reasoning"), _report(6))),
        ("qa_tools", prompts.proposer_messages("Answer multi-hop questions.", seeds.load("multihop_qa"), _report(3),
                                               tools=(contract.RETRIEVE,))),
        ("tight_chars", prompts.proposer_messages("t", "def solve(q, s):\n    return s(q)\n", _report(12),
                                                  config=prompts.PromptConfig(report_max_chars=700))),
        ("tokens_no_system", prompts.proposer_messages(
            "t", "def solve(q, s):\n    return s(q)\n", _report(9),
            config=prompts.PromptConfig(report_max_chars=3000, report_max_tokens=150, system_prompt=""),
            count_tokens=words)),
        ("empty_report", prompts.proposer_messages("Nothing ran.", seeds.load("reasoning"), _report(0))),
    ]
    return [(name, [dict(m) for m in msgs]) for name, msgs in out]
