"""The proposer prompt, the harness contract and the seed harnesses (run in the sandbox)."""


import pytest

from hljax.harness import contract, edits, prompts, seeds
from hljax.harness.report import ExecutionReport
from sandbox.config import SandboxConfig
from sandbox.pool import SandboxPool
from sandbox.results import Job, JobResult
from tests._sandbox_fakes import EchoGenerator
from sandbox.isolation import bwrap_path as _bwrap_path

needs_bwrap = pytest.mark.skipif(
    _bwrap_path() is None, reason="bwrap not installed (Debian package bubblewrap)"
)


def _report() -> ExecutionReport:
    return ExecutionReport.from_results([Job("c", "What is 2+2?", reference="4")], [JobResult("", "ok", "5", 0.0)])


def test_an_empty_report_ablation_shows_nothing_of_the_run_and_changes_nothing_else():
    harness = seeds.load("reasoning")
    full = prompts.user_prompt("Task text.", harness, _report())
    empty = prompts.user_prompt("Task text.", harness, _report(), config=prompts.PromptConfig(report="empty"))
    section = "## Execution report of the current harness on feedback questions\n"
    assert "Harness answer: 5" in full and "Harness answer" not in empty and "What is 2+2?" not in empty
    assert section + prompts.EMPTY_REPORT + "\n\n## Your answer" in empty
    before, after = full.split(section)[0], full.split("## Your answer")[1]
    assert empty.startswith(before) and empty.endswith(after)
    with pytest.raises(ValueError, match="report must be 'full' or 'empty'"):
        prompts.PromptConfig(report="none")


def test_messages_hold_task_contract_harness_report_and_format():
    harness = seeds.load("multihop_qa")
    msgs = prompts.proposer_messages("Answer multi-hop questions.", harness, _report(), tools=(contract.RETRIEVE,))
    assert [m["role"] for m in msgs] == ["system", "user"]
    assert msgs[0]["content"] == prompts.SYSTEM_PROMPT
    user = msgs[1]["content"]
    titles = [line for line in user.splitlines() if line.startswith("## ")]
    assert titles == [
        "## Task",
        "## Harness contract",
        "## Current harness",
        "## Execution report of the current harness on feedback questions",
        "## Your answer",
    ]
    assert "## Task\nAnswer multi-hop questions.\n\n## Harness contract\n" in user
    assert f"```python\n{harness.rstrip()}\n```" in user
    assert "- retrieve(query: str, k: int = 5) -> list[dict]: Searches this question's own paragraphs" in user
    assert edits.FORMAT_SPEC in user  # Rendered from the one description of the format.
    assert "Harness answer: 5" in user and "Reference answer: 4" in user


def test_report_budget_is_applied():
    jobs = [Job("c", "Q" * 3000, reference="R") for _ in range(20)]
    report = ExecutionReport.from_results(jobs, [JobResult("", "ok", "A", 0.0) for _ in jobs])
    user = prompts.user_prompt("t", "def solve(q, s):\n    return q\n", report, config=prompts.PromptConfig(1000))
    section = user.split("## Execution report of the current harness on feedback questions\n")[1].split("\n\n## ")[0]
    assert len(section) <= 1000 and report.render().startswith(section[:100])


def test_task_description_budget_cuts_to_the_longest_head_that_fits():
    import os
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(os.path.join(os.path.dirname(prompts.__file__), "..", "assets",
                                                                  "tokenizer"))
    n_tokens = lambda text: len(tok.encode(text, add_special_tokens=False))  # noqa: E731 - the reference count
    proposer = type("P", (), {"tokenizer": tok})()
    budget = prompts.PromptConfig(task_max_tokens=100)
    count = prompts.token_counter(budget, proposer)
    # Qwen's tokenizer splits digits one per token: one more character is one more token.
    grid = "Find the pattern.\n" + "\n".join("".join(str((r * c) % 10) for c in range(30)) for r in range(20))
    user = prompts.user_prompt(grid, "def solve(q, s):\n    return q\n", _report(), config=budget, count_tokens=count)
    shown = user.split("## Task\n")[1].split("\n\n## Harness contract")[0]
    head, marker = shown.rsplit("\n", 1)
    assert n_tokens(shown) <= 100 < n_tokens(grid)
    assert grid.startswith(head) and marker == f"[... {len(grid) - len(head)} more characters of the task description not shown]"
    longer = grid[:len(head) + 1 + len(grid[len(head):]) - len(grid[len(head):].lstrip())]  # One more visible char.
    assert n_tokens(f"{longer}\n[... {len(grid) - len(longer)} more characters of the task description not shown]") > 100
    short = prompts.user_prompt("Add two numbers.", "x", _report(), config=budget, count_tokens=count)
    assert "## Task\nAdd two numbers.\n\n" in short  # Within budget: whole, no marker.
    assert prompts.token_counter(prompts.PromptConfig(), proposer) is None  # No budget in tokens: no counting.
    assert prompts.token_counter(budget, object()) is None  # A Generator without a tokenizer: the error below.
    with pytest.raises(ValueError, match="task_max_tokens needs the proposer's tokenizer"):
        prompts.user_prompt(grid, "x", _report(), config=budget)


def test_contract_check():
    assert contract.check(seeds.load("reasoning")) is None
    assert contract.check(seeds.load("multihop_qa")) is None
    assert contract.check("def solve(q):\n    return q\n").reason.startswith("solve must accept two")
    assert contract.check("def other(q, s):\n    pass\n").reason == "no top-level function solve(question, solver)"
    assert contract.check("async def solve(q, s):\n    pass\n").reason == "solve must be a plain function, not async"
    assert contract.check("def solve(q, s)\n").reason.startswith("does not parse")


def test_unknown_seed():
    with pytest.raises(ValueError, match="unknown seed harness"):
        seeds.load("nope")


@needs_bwrap
def test_seed_harnesses_run_in_the_sandbox():
    paragraphs = [
        {"title": "Paris", "text": "Paris is the capital of France."},
        {"title": "France", "text": "France is in Europe."},
        {"title": "Rome", "text": "Rome is the capital of Italy."},
    ]
    queries = []

    def retrieve(query, k=5):
        queries.append((query, k))
        return paragraphs[:k]

    gen = EchoGenerator()
    with SandboxPool(SandboxConfig(workers=1), gen) as pool:
        rg, qa = pool.run(
            [
                Job(seeds.load("reasoning"), "What is 2+2?"),
                Job(seeds.load("multihop_qa"), "Capital of France?", tools={"retrieve": retrieve}),
            ]
        )
    assert rg.status == "ok" and rg.answer == "echo:What is 2+2?" and rg.solver_calls == 1
    assert qa.status == "ok", qa
    assert qa.solver_calls == 2 and qa.tool_calls == 2
    # Hop 2 searches with the solver's follow-up query: the echo of the prompt cut to 32 tokens.
    assert queries[0] == ("Capital of France?", 3) and queries[1][0].startswith("echo:Passages: [Paris]")
    # The answer prompt holds the three passages once (hop 2 found no new titles); the echo is cut
    # to 32 words by max_new_tokens=32.
    passages = "\n\n".join(f"[{p['title']}] {p['text']}" for p in paragraphs)
    prompt = (
        f"Passages:\n{passages}\n\nQuestion: Capital of France?\n\n"
        "Answer with a short phrase only (a name, date or number), no explanation."
    )
    assert qa.answer == " ".join(("echo:" + prompt).split()[:32])
    samplings = sorted((size, s.temperature, s.max_new_tokens) for _, size, s in gen.requests)
    assert samplings == [(1, 0.0, 32), (1, 0.0, 32), (1, 0.7, 1024)]


def test_sft_rows_render_with_the_proposers_thinking_mode():
    """model.enable_thinking decides the SFT prompt as it does GRPO's: off, Qwen3's template ends the
    generation prompt with an empty think block; on, the assistant turn is left open."""
    import os

    import transformers

    import hljax
    from hljax.rl.sft_data import SFTRow, encode

    tok = transformers.AutoTokenizer.from_pretrained(os.path.join(os.path.dirname(hljax.__file__), "assets",
                                                                  "tokenizer"))
    row = SFTRow("r", "rg/gcd", "h", ({"role": "user", "content": "revise"},), "edit")
    off, completion = encode(tok, row, enable_thinking=False)
    on, _ = encode(tok, row, enable_thinking=True)
    assert tok.decode(off) == "<|im_start|>user\nrevise<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert tok.decode(on) == "<|im_start|>user\nrevise<|im_end|>\n<|im_start|>assistant\n"
    assert completion[-1] == tok.eos_token_id
