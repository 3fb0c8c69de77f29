"""A task of your own in one Python file: questions with references, a scorer, a description and a
seed harness (docs/tasks.md).

    # my_task.py
    from hljax.tasks.plugin import TaskDef

    def score(answer: str, reference) -> float:  # In [0, 1].
        return float(answer.strip().lower() == reference.lower())

    TASK = TaskDef(name="capitals", description="...", questions="capitals.jsonl", score=score,
                   seed_harness="seed_harness.py")

Run it with `--config.tasks.suite=path/to/my_task.py`. Paths in a TaskDef are relative to its file.
The file is imported twice: on the trusted side (questions, description, seed harness) and, from
its text, inside the scorer sandbox, where harness answers are scored (never in the trainer). There
only the file's own text, hljax and site-packages exist, so a TaskDef reads nothing when it is made:
files are read when the task is built, and module-level code must not read data files.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import itertools
import json
import numbers
import os
import re
import sys
import types
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from hljax.harness import contract
from hljax.harness.contract import ToolSpec
from hljax.tasks.base import Question, Score, Suite, guarded
from hljax.tasks.qa_metrics import best_over_golds, exact_match, f1_score
from hljax.tasks.splits import QuestionSplits, SplitConfig, SplitQuestions, hash_ordered, question_id
from sandbox.results import ScorerSpec

# Built-in scorers a TaskDef may name instead of writing one: (answer, reference) -> [0, 1], the
# reference a string or a list of accepted strings. Normalised as SQuAD does (case, punctuation, articles).
BUILTIN_SCORERS: dict[str, Callable[[str, str], float]] = {
    "exact_match": exact_match,
    "f1": lambda answer, gold: f1_score(answer, gold, yes_no_rule=False),
}
# What the simulated solver (a CPU stand-in for an LLM) may be told about a plug-in task: the
# weaknesses of hljax/tasks/bottlenecks.py that make sense without a demanded answer format.
SIMULATED_WEAKNESSES = ("truncation", "careless", "variance", "buried")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class TaskFileError(ValueError):
    """A task file or its data is unusable; the message names the file and the fix."""


@dataclasses.dataclass(frozen=True)
class TaskDef:
    """One task, declared. Nothing is read until the task is built (see the module docstring)."""

    name: str  # Unique, letters/digits/._- (names run directories and reports).
    description: str  # What the proposer reads about the task (an example question is appended).
    # A JSONL file (relative to the task file) of {"question": str, "answer": reference[, "id": str]}
    # rows, or a function of the run's seed that yields such dicts (deterministic: the same seed
    # must give the same questions in every process, or splits and scores do not reproduce).
    questions: str | Callable[[int], Iterable[Mapping[str, Any]]]
    # fn(answer: str, reference) -> float in [0, 1], or the name of a built-in (BUILTIN_SCORERS).
    score: Callable[[str, Any], float] | str
    seed_harness: str  # The harness revision starts from: a file relative to the task file.
    # For the simulated solver only (a CPU stand-in for an LLM; ignored by real solvers): the
    # probability it answers a question right, and its weaknesses (SIMULATED_WEAKNESSES). A task it
    # does not know otherwise gets Behaviour.default_accuracy and no weakness.
    simulated_accuracy: float | None = None
    simulated_weaknesses: tuple[str, ...] = ()

    def __post_init__(self):
        where = f"TaskDef {self.name!r}"
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise TaskFileError(f"TaskDef name {self.name!r}: use letters, digits and ._- only")
        if isinstance(self.score, str) and self.score not in BUILTIN_SCORERS:
            raise TaskFileError(f"{where}: score={self.score!r} is not a built-in scorer; write a function "
                                f"(answer, reference) -> float or one of {sorted(BUILTIN_SCORERS)}")
        if not isinstance(self.score, str) and not callable(self.score):
            raise TaskFileError(f"{where}: score must be a function (answer, reference) -> float or a built-in name")
        if not isinstance(self.questions, str) and not callable(self.questions):
            raise TaskFileError(f"{where}: questions must be a JSONL path or a function of the seed")
        unknown = [w for w in self.simulated_weaknesses if w not in SIMULATED_WEAKNESSES]
        if unknown:
            raise TaskFileError(f"{where}: simulated_weaknesses {unknown} unknown; valid: {SIMULATED_WEAKNESSES}")
        if self.simulated_accuracy is not None and not 0.0 <= self.simulated_accuracy <= 1.0:
            raise TaskFileError(f"{where}: simulated_accuracy must be in [0, 1], got {self.simulated_accuracy}")


# ----- loading a task file ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TaskSource:
    """Where a TaskDef came from: its file's path and text (what the scorer sandbox imports)."""

    path: str
    text: str


def import_file(path: str) -> types.ModuleType:
    """Import a task file as a module of its own; any exception becomes one TaskFileError line."""
    if not os.path.isfile(path):
        raise TaskFileError(f"tasks.suite={path!r}: no such file (a path relative to {os.getcwd()})")
    name = _module_name(path)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # Dataclasses and pickling look a module up by name.
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - the user's file may raise anything on import.
        del sys.modules[name]
        raise TaskFileError(f"tasks.suite={path!r} raised on import: {_where(e, path)}{type(e).__name__}: {e}") from e
    return module


def suite_of(obj: Any, path: str, ref: str) -> Suite:
    """A Suite from what a task file or module exports: a Suite, a TaskDef or a list of TaskDefs."""
    if isinstance(obj, Suite):
        return obj
    defs = [obj] if isinstance(obj, TaskDef) else list(obj) if isinstance(obj, (list, tuple)) else None
    if not defs or not all(isinstance(d, TaskDef) for d in defs):
        raise TaskFileError(f"tasks.suite={ref!r}: expected a TaskDef, a list of TaskDefs or a Suite, "
                            f"got {type(obj).__name__}")
    names = [d.name for d in defs]
    if len(set(names)) != len(names):
        raise TaskFileError(f"tasks.suite={ref!r}: task names repeat: {names}")
    harnesses = {d.seed_harness for d in defs}
    if len(harnesses) != 1:
        raise TaskFileError(f"tasks.suite={ref!r}: the tasks of one suite share one seed harness, got {sorted(harnesses)}")
    with open(path) as f:
        source = TaskSource(os.path.abspath(path), f.read())
    seed = _read(_relative(source, defs[0].seed_harness), f"TaskDef {defs[0].name!r}: seed_harness")
    violation = contract.check(seed)
    if violation:
        raise TaskFileError(f"TaskDef {defs[0].name!r}: seed_harness {defs[0].seed_harness!r} {violation.reason}: "
                            f"{contract.describe().splitlines()[0]}")

    def build(spec, splits: SplitConfig, seed_: int) -> list:
        chosen = defs
        if spec.families:
            unknown = [f for f in spec.families if f not in names]
            if unknown:
                raise TaskFileError(f"tasks.families {unknown} are not tasks of {ref!r}; its tasks: {names}")
            chosen = [d for d in defs if d.name in spec.families]
        return [PluginTask(d, source, splits, seed_, spec.pool_size) for d in chosen]

    return Suite(name=ref, build=build, seed_harness=seed, names=tuple(names))


def load(ref: str) -> Suite:
    """The suite of a task file (`path/to/task.py`: its SUITE, TASKS or TASK) or of a module
    attribute (`package.module:NAME`)."""
    if ref.endswith(".py"):
        module = import_file(ref)
        for attr in ("SUITE", "TASKS", "TASK"):
            if hasattr(module, attr):
                return suite_of(getattr(module, attr), ref, ref)
        raise TaskFileError(f"tasks.suite={ref!r} defines none of SUITE, TASKS or TASK: add e.g. "
                            "TASK = TaskDef(...) (docs/tasks.md)")
    module_name, _, attr = ref.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - as import_file.
        raise TaskFileError(f"tasks.suite={ref!r}: importing {module_name!r} failed: {type(e).__name__}: {e}") from e
    if not hasattr(module, attr):
        raise TaskFileError(f"tasks.suite={ref!r}: module {module_name!r} has no {attr!r}")
    return suite_of(getattr(module, attr), module.__file__, ref)


# ----- the task --------------------------------------------------------------------------------


class PluginTask(SplitQuestions):
    """A TaskDef's questions split into feedback / scoring / eval, and its scorer. No tools."""

    def __init__(self, definition: TaskDef, source: TaskSource, splits: SplitConfig, seed: int, pool_size: int):
        self.definition, self.source = definition, source
        rows = self._rows(seed, pool_size)
        questions = [self._question(i, row) for i, row in enumerate(rows)]
        if not isinstance(definition.questions, str):
            self._splits = QuestionSplits(questions, splits, self.name)
        else:  # A file's order says nothing: the same questions in any order split and sample alike.
            self._splits = QuestionSplits(hash_ordered(questions, splits.seed), splits, self.name)
        self._count = len(questions)

    @property
    def name(self) -> str:
        return self.definition.name

    @property
    def description(self) -> str:
        # The first feedback question is shown in reports anyway.
        example = self._splits.take("feedback", 1)[0].text
        return f"{self.definition.description.strip()}\n\nAn example question:\n{example}"

    @property
    def tool_specs(self) -> tuple[ToolSpec, ...]:
        return ()

    @property
    def simulated_accuracy(self) -> float | None:
        return self.definition.simulated_accuracy

    @property
    def simulated_weaknesses(self) -> tuple[str, ...]:
        return self.definition.simulated_weaknesses

    def __len__(self) -> int:
        return self._count

    def score(self, answer: str, question: Question) -> Score:
        return _score(_scoring_fn(self.definition.score), answer, question.payload)

    def scorer_spec(self) -> ScorerSpec:
        d = self.definition
        if isinstance(d.score, str):
            return ScorerSpec(f"{__name__}:builtin_scorer", (("name", d.score),))
        return ScorerSpec(f"{__name__}:file_scorer", (("source", self.source.text), ("path", self.source.path),
                                                      ("task", d.name)))

    def score_payload(self, question: Question) -> Any:
        return question.payload

    def tools(self, question: Question) -> Mapping[str, Callable[..., Any]]:
        return {}

    def _rows(self, seed: int, pool_size: int) -> list[Mapping[str, Any]]:
        d = self.definition
        if isinstance(d.questions, str):
            path = _relative(self.source, d.questions)
            text = _read(path, f"TaskDef {d.name!r}: questions")
            rows = []
            for n, line in enumerate(text.splitlines(), 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise TaskFileError(f"{path}:{n}: not a JSON line ({e.msg})") from e
            where = path
        else:
            try:
                rows = list(itertools.islice(d.questions(seed), pool_size))
            except Exception as e:  # noqa: BLE001 - the user's generator.
                raise TaskFileError(f"TaskDef {d.name!r}: questions({seed}) raised {type(e).__name__}: {e}") from e
            where = f"TaskDef {d.name!r}: questions({seed})"
        for i, row in enumerate(rows):
            if not isinstance(row, Mapping) or not isinstance(row.get("question"), str) or not row["question"].strip():
                raise TaskFileError(f"{where}: question {i + 1} has no 'question' text: write "
                                    '{"question": "...", "answer": ...}')
            if row.get("answer") in (None, ""):
                raise TaskFileError(f"{where}: question {i + 1} ({row['question'][:60]!r}) has no reference 'answer'")
        return rows

    def _question(self, index: int, row: Mapping[str, Any]) -> Question:
        reference = row["answer"]
        shown = reference if isinstance(reference, str) else json.dumps(reference)
        key = str(row["id"]) if "id" in row else row["question"]
        return Question(qid=question_id(self.name, key), text=row["question"], answer=shown, payload=reference)


def _module_name(path: str) -> str:
    return "hljax_task_" + re.sub(r"\W", "_", os.path.abspath(path))


def _relative(source: TaskSource, path: str) -> str:
    return path if os.path.isabs(path) else os.path.join(os.path.dirname(source.path), path)


def _read(path: str, what: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError as e:
        raise TaskFileError(f"{what}: cannot read {path!r}: {e.strerror}") from e


def _where(e: BaseException, path: str) -> str:
    """'line N: ' of the task file in an exception's traceback, if it is there."""
    tb, line = e.__traceback__, None
    while tb is not None:
        if os.path.abspath(tb.tb_frame.f_code.co_filename) == os.path.abspath(path):
            line = tb.tb_lineno
        tb = tb.tb_next
    return f"line {line}: " if line else ""


# ----- scoring (also run in the scorer sandbox) -------------------------------------------------


def _scoring_fn(score: Callable[[str, Any], float] | str) -> Callable[[str, Any], float]:
    if not isinstance(score, str):
        return score
    fn = BUILTIN_SCORERS[score]
    return lambda answer, ref: best_over_golds(fn, answer, [ref] if isinstance(ref, str) else ref)


def _score(fn: Callable[[str, Any], float], answer: str, reference: Any) -> Score:
    """`guarded`, and a value that is not a number (a string, None) is a scorer error too."""
    def checked() -> float:
        value = fn(answer, reference)
        # numbers.Real takes numpy's scalars too (a scorer computing with numpy returns np.float32).
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
            raise TypeError(f"the scorer returned {type(value).__name__} {value!r}, not a number in [0, 1]")
        return float(value)
    return guarded(checked)


def builtin_scorer(name: str):
    """Factory, run in the scorer process."""
    return functools.partial(_score, _scoring_fn(name))


def file_scorer(source: str, path: str, task: str):
    """Factory, run in the scorer process: the task file executed from its text (its path does not
    exist there), and the named TaskDef's scoring function."""
    module = types.ModuleType(_module_name(path))
    module.__file__ = path
    sys.modules[module.__name__] = module
    exec(compile(source, path, "exec"), module.__dict__)  # noqa: S102 - the user's own task file, in the scorer sandbox.
    for attr in ("SUITE", "TASKS", "TASK"):
        obj = module.__dict__.get(attr)
        for d in [obj] if isinstance(obj, TaskDef) else obj if isinstance(obj, (list, tuple)) else ():
            if isinstance(d, TaskDef) and d.name == task:
                return functools.partial(_score, _scoring_fn(d.score))
    raise LookupError(f"{path}: no TaskDef named {task!r} when imported in the scorer sandbox")
