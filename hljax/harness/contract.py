"""The harness contract: what a harness module must define and what it may call.

A harness is the source of one Python module that defines `solve(question: str, solver) -> str`.
`solver` is the only way to reach the solver LLM (`Solver` below; served by `sandbox.runner`).
A task's tools, e.g. `retrieve(query, k)` for multi-hop QA, are predefined globals of the module;
they run on the trusted side with the question's own data (see `sandbox.pool.SandboxPool`).
The standard library is importable; network, subprocesses and files outside the work dir are not.
"""

from __future__ import annotations

import ast
import dataclasses
from typing import Protocol, Sequence


class Solver(Protocol):
    """The handle a harness receives (implemented by `sandbox.runner.Solver`).

    A prompt is sent as one user turn of a chat (the pool's `SolverConfig.prompt_mode="chat"`, the
    default for instruct solvers) and the completion text is returned. Sampling keywords:
    max_new_tokens, temperature, top_p, top_k, stop, seed; unset ones take the pool's defaults.
    """

    def generate(self, prompt: str, **sampling) -> str: ...

    def generate_batch(self, prompts: list[str], **sampling) -> list[str]: ...


@dataclasses.dataclass(frozen=True)
class ToolSpec:
    """How a tool is described to the proposer."""

    name: str
    signature: str
    description: str


RETRIEVE = ToolSpec(
    name="retrieve",
    signature="retrieve(query: str, k: int = 5) -> list[dict]",
    description="Searches this question's own paragraphs; returns up to k of them, best first, "
    "each as {'title': str, 'text': str}.",
)


def describe(tools: Sequence[ToolSpec] = ()) -> str:
    """The contract as the proposer reads it."""
    lines = [
        "The harness is a Python module that defines solve(question: str, solver) -> str.",
        "solve receives one question and returns the final answer as a string.",
        "The solver LLM is reachable only through the solver handle:",
        "- solver.generate(prompt: str, **sampling) -> str: one completion for one prompt, sent as a user message.",
        "- solver.generate_batch(prompts: list[str], **sampling) -> list[str]: several prompts in one call.",
        "  Sampling keywords: max_new_tokens, temperature, top_p, top_k, stop, seed.",
        "Each question has a budget of solver calls and tokens and a time limit; exceeding the call or",
        "token budget raises an exception. Only the standard library is available: no network,",
        "no subprocesses. Printed output appears in the execution report.",
    ]
    if tools:
        lines.append("These functions are predefined globals of the module (do not define or import them):")
        lines += [f"- {t.signature}: {t.description}" for t in tools]
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class ContractViolation:
    """The code compiles but cannot be a harness."""

    reason: str


def check(code: str) -> ContractViolation | None:
    """A static check: a top-level `solve` taking (question, solver). Syntax errors count too."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        return ContractViolation(f"does not parse: {e}")
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "solve":
            args = node.args
            positional = len(args.posonlyargs) + len(args.args)
            if positional >= 2 or args.vararg is not None:
                return None
            return ContractViolation("solve must accept two positional arguments: (question, solver)")
        if isinstance(node, ast.AsyncFunctionDef) and node.name == "solve":
            return ContractViolation("solve must be a plain function, not async")
    return ContractViolation("no top-level function solve(question, solver)")
