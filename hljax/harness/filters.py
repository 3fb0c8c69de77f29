"""Quality filters for teacher revisions (SFT data) and the static scans the reward guards share.

A proposal becomes an SFT row only if every filter passes. Each filter is a pure function that
returns a `Verdict` under its own name; the collector records every verdict it computed and names
the first failure as the row's rejection reason. In the order the collector applies them:

- valid_edit:          the completion's edits parse and apply to the parent harness, change it, and
                       the result keeps the harness contract (`loop.revision.candidate`).
- size_limits:         the new harness and the completion stay within `FilterConfig`'s limits.
- no_reference_access: no attempt to reach reference answers or the machine: no import of modules
                       that inspect the interpreter or touch files/processes (os, sys, gc, inspect,
                       ...), no open/eval/exec/compile/__import__/globals/vars, no computed
                       getattr, no dunder or frame attributes (__globals__, f_back, ...), no
                       attributes named like the job's private fields (.reference, .answer,
                       .payload, ...), no filesystem paths in string literals. The sandbox already
                       keeps references out of the worker (tests/test_reward_guards.py proves it);
                       this rejects the attempt, which SFT must not teach and RL must not reward.
- no_hardcoded_answers: no string literal added to the parent harness equals a reference answer of
                       the feedback or scoring questions (after `normalize`), or contains one of at
                       least `min_reference_chars` characters as a whole word sequence; references
                       of at least `min_numeric_digits` digits also match numeric literals.
- solver_settings:     the solver handle is used only through solver.generate / generate_batch,
                       never rebound or inspected, and no call passes a sampling keyword that the
                       task fixes (`FilterConfig.fixed_sampling`; then **kwargs are refused too,
                       since they cannot be checked).
- runs_clean:          the new harness returned an answer (status "ok") on every feedback question.
- not_flagged:         no reward-hacking flag (`hljax.loop.rewards.flags`) on the scoring runs.
- improves:            its mean scoring-set score beats the parent's by more than `min_improvement`.

The static scans are deliberately strict and best-effort: a harness for these tasks needs only
the solver handle, string handling and pure computation, so refusing the rest costs little; a
determined obfuscation (computed strings fed to a refused builtin) still trips the builtin rule.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from typing import Iterable, Sequence

from hljax.harness import contract, edits

# Modules that read the interpreter's state, files, processes or the network: the only ways a
# harness could look for what it is not given. Not ast (literal_eval parses answers), io or types.
DENIED_MODULES = frozenset({
    "os", "sys", "gc", "inspect", "ctypes", "importlib", "builtins", "pathlib", "subprocess", "socket",
    "shutil", "glob", "tempfile", "pickle", "marshal", "mmap", "multiprocessing", "posix", "resource", "signal",
    "sandbox", "hljax", "traceback", "linecache", "code", "codeop", "runpy", "pty", "fcntl", "select",
    "_thread", "pdb", "bdb", "tracemalloc", "faulthandler", "sysconfig", "site", "fileinput", "shelve", "dbm",
    "sqlite3", "zipfile", "tarfile", "urllib", "http", "ssl", "asyncio", "ftplib", "smtplib", "webbrowser",
    "atexit", "weakref", "copyreg", "zipimport", "pkgutil", "modulefinder", "dis", "symtable", "pwd",
})  # fmt: skip
DENIED_CALLS = frozenset({"open", "eval", "exec", "compile", "__import__", "globals", "locals", "vars",
                          "breakpoint", "input", "help", "memoryview"})
ATTRIBUTE_CALLS = frozenset({"getattr", "setattr", "delattr", "hasattr"})
# Frame, code and function internals: the routes from a harness frame to its callers' variables.
FRAME_ATTRIBUTES = frozenset({"f_back", "f_globals", "f_locals", "f_builtins", "f_code", "gi_frame", "gi_code",
                              "cr_frame", "ag_frame", "tb_frame", "tb_next", "co_consts", "func_globals"})
# Field names of `Job`, `Question` and the task payloads: what a cheat would look for.
PRIVATE_FIELDS = frozenset({"reference", "references", "answer", "answers", "payload", "entry", "metadata",
                            "_channel", "gold", "aliases"})
ALLOWED_DUNDERS = frozenset({"__init__", "__name__", "__len__", "__iter__", "__next__", "__enter__", "__exit__",
                             "__repr__", "__str__", "__eq__", "__hash__", "__lt__"})
DENIED_NAMES = frozenset({"__builtins__", "__loader__", "__spec__", "__file__", "__cached__"})
_PATH = re.compile(r"(^|[^\w])/(proc|dev|sys|tmp|etc|opt|home|root|usr|var|run|mnt)(/|\b)")
SOLVER_METHODS = frozenset({"generate", "generate_batch"})


@dataclasses.dataclass(frozen=True)
class FilterConfig:
    """Limits of the quality filters."""

    max_code_chars: int = 12_000  # The new harness.
    max_code_lines: int = 300  # Harnesses longer than this are dropped.
    max_completion_chars: int = 16_000  # The teacher's whole reply.
    # Sampling keywords (of solver.generate) the task fixes; a harness may not pass them. Empty:
    # the contract lets harnesses set every keyword (see hljax.harness.contract.describe).
    fixed_sampling: tuple[str, ...] = ()
    min_improvement: float = 0.0  # The candidate must beat the parent's scoring mean by more than this.
    min_reference_chars: int = 4  # Shorter references match only a whole literal, not a substring.
    min_numeric_digits: int = 3  # Shorter numeric references do not match numeric literals (1, 10, -1 ...).

    def __post_init__(self):
        for name in ("max_code_chars", "max_code_lines", "max_completion_chars", "min_reference_chars",
                     "min_numeric_digits"):
            if getattr(self, name) < 1:
                raise ValueError(f"filters.{name} must be >= 1, got {getattr(self, name)}")
        unknown = sorted(set(self.fixed_sampling) - {"max_new_tokens", "temperature", "top_p", "top_k", "stop", "seed"})
        if unknown:
            raise ValueError(f"filters.fixed_sampling names unknown sampling keywords {unknown}")
        if self.min_improvement < 0:
            raise ValueError(f"filters.min_improvement must be >= 0, got {self.min_improvement}")


@dataclasses.dataclass(frozen=True)
class Verdict:
    name: str  # The filter.
    ok: bool
    detail: str = ""  # Why not, when not ok.


def normalize(text: str) -> str:
    """Answers and references compare after stripping, collapsing whitespace and case folding."""
    return " ".join(text.split()).casefold()


# ----- edit and size ------------------------------------------------------------------------------


def valid_edit(result) -> Verdict:
    """`result`: `loop.revision.candidate(...)` (an `edits.Applied` or a typed failure)."""
    if isinstance(result, edits.Applied):
        return Verdict("valid_edit", True)
    detail = result.reason if isinstance(result, contract.ContractViolation) else result.describe()
    return Verdict("valid_edit", False, f"{type(result).__name__}: {detail}"[:500])


def size_limits(code: str, completion: str, cfg: FilterConfig) -> Verdict:
    problems = []
    if len(code) > cfg.max_code_chars:
        problems.append(f"harness has {len(code)} chars > {cfg.max_code_chars}")
    lines = code.count("\n") + 1
    if lines > cfg.max_code_lines:
        problems.append(f"harness has {lines} lines > {cfg.max_code_lines}")
    if len(completion) > cfg.max_completion_chars:
        problems.append(f"completion has {len(completion)} chars > {cfg.max_completion_chars}")
    return Verdict("size_limits", not problems, "; ".join(problems))


# ----- static scans -------------------------------------------------------------------------------


def reference_access(code: str) -> tuple[str, ...]:
    """What in `code` reaches for references, the interpreter's internals or the machine ("" if none).
    Code that does not parse yields nothing here: `valid_edit` rejects it."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return ()
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [f"imports {a.name}" for a in node.names if a.name.split(".")[0] in DENIED_MODULES]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and (node.module or "").split(".")[0] in DENIED_MODULES:
                found.append(f"imports from {node.module}")
            elif node.level > 0:
                found.append("relative import")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            name = node.func.id
            if name in DENIED_CALLS:
                found.append(f"calls {name}()")
            elif name in ATTRIBUTE_CALLS:
                attr = node.args[1] if len(node.args) > 1 else None
                if not (isinstance(attr, ast.Constant) and isinstance(attr.value, str)):
                    found.append(f"calls {name}() with a computed attribute name")
                elif _bad_attribute(attr.value):
                    found.append(f"calls {name}(..., {attr.value!r})")
        elif isinstance(node, ast.Attribute) and _bad_attribute(node.attr):
            found.append(f"attribute .{node.attr}")
        elif isinstance(node, ast.Name) and node.id in DENIED_NAMES:
            found.append(f"name {node.id}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
            text = node.value.decode("latin-1") if isinstance(node.value, bytes) else node.value
            if _PATH.search(text):
                found.append(f"path in literal {text[:60]!r}")
    return tuple(dict.fromkeys(found))


def _bad_attribute(attr: str) -> bool:
    if attr.startswith("__") and attr.endswith("__"):
        return attr not in ALLOWED_DUNDERS
    return attr in FRAME_ATTRIBUTES or attr in PRIVATE_FIELDS


def no_reference_access(code: str) -> Verdict:
    found = reference_access(code)
    return Verdict("no_reference_access", not found, "; ".join(found)[:500])


def _literals(code: str) -> tuple[list[str], list[float]]:
    """String literals (docstrings and f-string parts included) and numeric literals of `code`."""
    strings, numbers = [], []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Constant):
            if isinstance(node.value, str):
                strings.append(node.value)
            elif isinstance(node.value, bytes):
                strings.append(node.value.decode("latin-1"))
            elif isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
                numbers.append(node.value)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
            if isinstance(node.operand.value, (int, float)) and not isinstance(node.operand.value, bool):
                numbers.append(-node.operand.value)
    return strings, numbers


def hardcoded_answers(code: str, parent: str, references: Iterable[str], cfg: FilterConfig) -> tuple[str, ...]:
    """References that literals new in `code` (absent from `parent`) spell out. See the module docstring."""
    strings, numbers = _literals(code)
    old_strings, old_numbers = _literals(parent)
    old = {normalize(s) for s in old_strings}
    new = [n for n in {normalize(s) for s in strings} - old if n]
    new_numbers = set(numbers) - set(old_numbers)
    hits = []
    for ref in dict.fromkeys(normalize(str(r)) for r in references):
        if not ref:
            continue
        if ref in new:
            hits.append(ref)
        elif len(ref) >= cfg.min_reference_chars and any(_contains_words(s, ref) for s in new):
            hits.append(ref)
        elif _is_number(ref) and len(ref.lstrip("-").replace(".", "")) >= cfg.min_numeric_digits:
            if any(float(ref) == n for n in new_numbers):
                hits.append(ref)
    return tuple(hits)


def _contains_words(text: str, ref: str) -> bool:
    # Whole-word containment: "12" must not match inside "1234", "the" not inside "other".
    return re.search(r"(?<!\w)" + re.escape(ref) + r"(?!\w)", text) is not None


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return text.lower() not in ("nan", "inf", "-inf", "infinity", "-infinity")


def no_hardcoded_answers(code: str, parent: str, references: Sequence[str], cfg: FilterConfig) -> Verdict:
    hits = hardcoded_answers(code, parent, references, cfg)
    return Verdict("no_hardcoded_answers", not hits, f"literals spell out reference answers {list(hits)[:5]}"[:500]
                   if hits else "")


def solver_misuse(code: str, fixed_sampling: Sequence[str]) -> tuple[str, ...]:
    """Uses of the solver handle other than calling generate/generate_batch with allowed keywords."""
    tree = ast.parse(code)
    solver_names = {"solver"}
    for node in ast.walk(tree):  # The second parameter of solve, whatever it is called.
        if isinstance(node, ast.FunctionDef) and node.name == "solve":
            params = node.args.posonlyargs + node.args.args
            if len(params) >= 2:
                solver_names.add(params[1].arg)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in solver_names:
            if node.attr not in SOLVER_METHODS:
                found.append(f"touches {node.value.id}.{node.attr}")
            elif not isinstance(node.ctx, ast.Load):
                found.append(f"rebinds {node.value.id}.{node.attr}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in SOLVER_METHODS:
            for kw in node.keywords:
                if kw.arg is None and fixed_sampling:
                    found.append(f"passes **kwargs to {node.func.attr} (the task fixes {sorted(fixed_sampling)})")
                elif kw.arg in fixed_sampling:
                    found.append(f"sets {kw.arg}, which the task fixes")
    return tuple(dict.fromkeys(found))


def solver_settings(code: str, cfg: FilterConfig) -> Verdict:
    found = solver_misuse(code, cfg.fixed_sampling)
    return Verdict("solver_settings", not found, "; ".join(found)[:500])


# ----- runtime ------------------------------------------------------------------------------------


def runs_clean(feedback_results) -> Verdict:
    """`feedback_results`: the new harness's `JobResult`s on the feedback questions."""
    bad = [f"{r.tag}: {r.status}" + (f" ({r.error.type}: {r.error.message[:100]})" if r.error else f" ({r.reason})")
           for r in feedback_results if r.status != "ok"]
    return Verdict("runs_clean", not bad, f"{len(bad)} of {len(feedback_results)} failed: " + "; ".join(bad[:3])
                   if bad else "")


def not_flagged(flags: Sequence[str]) -> Verdict:
    return Verdict("not_flagged", not flags, ", ".join(flags))


def improves(parent_score: float, candidate_score: float, cfg: FilterConfig) -> Verdict:
    ok = candidate_score > parent_score + cfg.min_improvement
    return Verdict("improves", ok, "" if ok else f"scoring mean {candidate_score:.3f} vs parent {parent_score:.3f}")
