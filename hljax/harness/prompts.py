"""The proposer prompt: task description + current harness + execution report -> chat messages.

The messages go to `Generator.chat`, which applies the proposer's chat template (Qwen's). The edit
format is rendered from `edits.FORMAT_SPEC` and the contract from `contract.describe`, so the
prompt and the parser cannot drift apart. With `history.mode` other than "off", a section of earlier
candidates of the run (hljax/harness/history.py) sits between the report and the answer format;
off, the prompt is the paper's, byte for byte.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Literal, Sequence

from hljax.generate.types import Message
from hljax.harness import contract, edits
from hljax.harness.history import HistoryConfig, HistoryEntry, render_history
from hljax.harness.report import ExecutionReport, longest_fit

SYSTEM_PROMPT = (
    "You improve agent harnesses: Python programs that solve tasks by calling a frozen solver LLM. "
    "You read a harness and what happened when it ran, then rewrite parts of it so that it scores higher."
)
EMPTY_REPORT = "(no report: the harness's run on feedback questions is not shown)"


@dataclasses.dataclass(frozen=True)
class PromptConfig:
    """Sizes of the proposer prompt's parts."""

    report_max_chars: int = 6000  # The execution report is shrunk to fit (see ExecutionReport.render).
    report_max_tokens: int | None = None  # Also a token budget, when a tokenizer count is given.
    # The task description is cut to this many tokens of the proposer's tokenizer, with a marker
    # saying how much was cut; None: whole, the paper's prompt. A small proposer reads garbage past
    # the positions it was trained on (issue 33: held-out descriptions of 1,000-1,400 tokens, where the
    # training families' are at most 293, put the tiny proposer's prompts past 2,000 tokens).
    task_max_tokens: int | None = None
    system_prompt: str = SYSTEM_PROMPT  # The proposer's system message ("": none).
    history: HistoryConfig = HistoryConfig()  # Earlier candidates of the run (off: the paper's prompt).
    # "empty": the report section says only EMPTY_REPORT, whatever the harness did: an ablation that
    # shows what a proposer makes of the task and the harness alone (bench/learning.py).
    report: Literal["full", "empty"] = "full"

    def __post_init__(self):
        if self.report not in ("full", "empty"):
            raise ValueError(f"report must be 'full' or 'empty', got {self.report!r}")
        if self.report_max_chars < 200:
            raise ValueError(f"report_max_chars must be >= 200, got {self.report_max_chars}")
        if self.task_max_tokens is not None and self.task_max_tokens < 32:
            raise ValueError(f"task_max_tokens must be >= 32 or None, got {self.task_max_tokens}")


def user_prompt(
    task_description: str,
    harness: str,
    report: ExecutionReport,
    tools: Sequence[contract.ToolSpec] = (),
    config: PromptConfig = PromptConfig(),
    count_tokens: Callable[[str], int] | None = None,
    history: Sequence[HistoryEntry] = (),
) -> str:
    """The user turn: task, contract, harness, report, (history,) then the answer format."""
    rendered = EMPTY_REPORT if config.report == "empty" else report_text(report, config, count_tokens)
    sections = [
        ("Task", fit_description(task_description.strip(), config.task_max_tokens, count_tokens)),
        ("Harness contract", contract.describe(tools)),
        ("Current harness", f"```python\n{harness.rstrip()}\n```"),
        ("Execution report of the current harness on feedback questions", rendered),
    ]
    if config.history.enabled:
        sections.append(("Earlier candidates in this run (oldest first)", history_text(history, config, count_tokens)))
    sections.append(("Your answer", edits.FORMAT_SPEC))
    body = "\n\n".join(f"## {title}\n{text}" for title, text in sections)
    return body + "\n\nChange the harness so that it answers more questions correctly. Reply with edit blocks."


def report_text(report: ExecutionReport, config: PromptConfig = PromptConfig(),
                count_tokens: Callable[[str], int] | None = None) -> str:
    """The report within the prompt's budgets: what a full-report prompt shows and what records keep
    (also for an empty-report prompt, whose records keep the report it hid)."""
    return report.render(max_chars=config.report_max_chars, max_tokens=config.report_max_tokens,
                         count_tokens=count_tokens)


def fit_description(text: str, max_tokens: int | None, count_tokens: Callable[[str], int] | None) -> str:
    """`text` whole, or its longest head within `max_tokens` (marker included) and a marker."""
    if max_tokens is None:
        return text
    if count_tokens is None:
        raise ValueError("prompt.task_max_tokens needs the proposer's tokenizer to count with (a server proposer "
                         "given by URL alone has none: give its HF folder too)")
    if count_tokens(text) <= max_tokens:
        return text

    def cut(n: int) -> str:
        head = text[:n].rstrip()
        return f"{head}\n[... {len(text) - len(head)} more characters of the task description not shown]"

    return cut(longest_fit(len(text), lambda n: count_tokens(cut(n)) <= max_tokens))


def token_counter(config: PromptConfig, proposer) -> Callable[[str], int] | None:
    """What `config`'s token budgets count with: the tokenizer `proposer` (a Generator) renders its chat
    template with; None when no budget is in tokens, or the proposer has no tokenizer (then a budget in
    tokens fails with a clear error when the prompt is built)."""
    # hljax's generators all carry `.tokenizer`; a user's own Generator need not, unless it is given budgets.
    tokenizer = getattr(proposer, "tokenizer", None)
    budgets = (config.task_max_tokens, config.report_max_tokens,
               config.history.max_tokens if config.history.enabled else None)
    if all(b is None for b in budgets) or tokenizer is None:
        return None
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False))


def history_text(history: Sequence[HistoryEntry], config: PromptConfig = PromptConfig(),
                 count_tokens: Callable[[str], int] | None = None) -> str:
    """The history section as the proposer sees it ("" when history is off): what records keep."""
    if not config.history.enabled:
        return ""
    return render_history(history, config.history, count_tokens if config.history.max_tokens is not None else None)


def proposer_messages(
    task_description: str,
    harness: str,
    report: ExecutionReport,
    tools: Sequence[contract.ToolSpec] = (),
    config: PromptConfig = PromptConfig(),
    count_tokens: Callable[[str], int] | None = None,
    history: Sequence[HistoryEntry] = (),
) -> list[Message]:
    """System and user messages for `Generator.chat`. `history`: earlier candidates of the run, shown
    only when `config.history` is on."""
    return [
        {"role": "system", "content": config.system_prompt},
        {"role": "user", "content": user_prompt(task_description, harness, report, tools, config, count_tokens,
                                                history)},
    ]
