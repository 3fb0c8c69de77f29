"""A simulated solver: a STAND-IN FOR AN LLM, for CPU runs and tests, never a model of any real one.

No pretrained weights can be had on a CPU-only machine, and a random tiny model scores 0 on every
question whatever the harness does, so harness learning cannot be seen with it. `SimulatedSolver`
implements the `Generator` protocol and answers from the question's reference, with a seeded
accuracy model keyed to what the prompt asks for and how it is sampled, never to any particular
edit text. Everything it does is in `Behaviour`, one table, and in the per-family weaknesses of
`hljax/tasks/bottlenecks.py` (format, truncation, careless, variance, buried), each with its own
symptom in the reply and its own fix in the harness:

- It recognises a question by a line of the question's text appearing in the prompt. The trusted
  side registers every question it sends to the sandbox (`hljax.tasks.jobs.announce`); references
  stay in this process and never enter the sandbox. A prompt holding no registered question gets a
  fixed confused reply.
- Accuracy: a base per reasoning-gym category (`base_accuracy`), shifted per question by a seeded
  difficulty. A question's draws are fixed per question (the same answer whatever the prompt's
  wording or the temperature), except on a `variance` family, where every sample at temperature > 0
  is drawn afresh (`guess_scale` of the accuracy, wrong answers spread over `guess_near_misses`): a
  majority vote of samples at temperature > 0 helps there and nowhere else.
- Format: the answer is written in the question's demanded format with probability `format_kept`;
  on a `format` family only `format_weak` unless the prompt insists on the format (`format_stressed`);
  `format_missing` when the demand was cut out of the prompt, `format_suppressed` when the prompt
  asks for plain text. Otherwise the answer is written as a sentence, which no format accepts.
- Reasoning costs tokens: a reply that reasons first (always on a `truncation` family, elsewhere
  when the prompt asks for it) writes about `reasoning_tokens` tokens before the answer, so a
  too-small `max_new_tokens` cuts the reply before the answer. Asking to reason gains nothing else.
- `careless`: the reply starts "Quick answer:" and carries the question's one slip with
  probability `slip_rate`, `slip_rate_checked` when the prompt asks to check a proposed answer.
- `variance`: the reply starts "Not sure, guessing:".
- `buried`: with probability `note_rate` the reply ends with a note holding a second, wrong answer
  in the demanded format; answer extraction takes the last one.
- Fixes cost something where they are not needed: a sample at temperature > 0 of a solver that
  answers consistently is worse (`sampled_penalty`), and a check of a proposed answer talks a solver
  without the `careless` weakness out of a right answer (`second_guess_rate`).
- Wrong answers are plausible near-misses (a digit or a character off).

Every output of a run that uses it says so (`LABEL` in metrics, reports and tables), and a config
that names a model path or URL together with the simulated backend is refused.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
import threading
from typing import Mapping, Sequence

import numpy as np

from hljax.generate.types import Completion, Message, SamplingParams
from hljax.tasks import bottlenecks
from hljax.tasks.base import Question, Task
from hljax.tasks.formats import FORMATS, INTROS
from hljax.tasks.plugin import PluginTask
from hljax.tasks.reasoning_gym import RGPayload, category

LABEL = "simulated solver (a stand-in for an LLM on CPU; scores are not a real model's)"


@dataclasses.dataclass(frozen=True)
class Behaviour:
    """The simulated solver's whole behaviour table. Accuracies are probabilities of a right answer."""

    # Base accuracy of an answer to the bare question, per reasoning-gym category (the task name's
    # family's package); other tasks (multi-hop QA) get `default_accuracy`.
    base_accuracy: Mapping[str, float] = dataclasses.field(default_factory=lambda: {
        "arithmetic": 0.55, "algorithmic": 0.55, "algebra": 0.50, "games": 0.40, "logic": 0.50,
        "graphs": 0.45, "cognition": 0.45, "geometry": 0.45, "arc": 0.40,
    })
    default_accuracy: float = 0.35
    question_spread: float = 1.0  # Std of a question's difficulty, in logits: questions differ.
    max_accuracy: float = 0.95
    format_kept: float = 0.95  # P(demanded format): a family without the format weakness.
    format_weak: float = 0.10  # ...a `format` family when the prompt does not insist on the format.
    format_stressed: float = 0.95  # ...a `format` family when the prompt insists.
    format_missing: float = 0.10  # ...when the question's demand was cut out of the prompt.
    format_suppressed: float = 0.05  # ...when the prompt asks for plain text / no formatting.
    reasoning_tokens: int = 240  # Words of reasoning (about 380 tokens) written before the answer when it reasons.
    slip_rate: float = 0.75  # `careless`: P(the question's slip).
    slip_rate_checked: float = 0.05  # ...when the prompt asks to check a proposed answer.
    guess_scale: float = 0.6  # `variance`: a sample's accuracy, as a share of the question's.
    guess_near_misses: int = 6  # `variance`: distinct wrong answers per question.
    note_rate: float = 0.9  # `buried`: P(a trailing note with a wrong answer).
    # What a fix costs where it is not needed: a sample at temperature > 0 of a solver that answers
    # consistently is right this much less often (as a share); asked to check a proposed answer, a
    # solver without the `careless` weakness talks itself out of a right one this often.
    sampled_penalty: float = 0.3
    second_guess_rate: float = 0.3
    near_misses: int = 2  # Distinct wrong answers per question elsewhere.


REASONING = re.compile(r"step[- ]by[- ]step|\bthink\b|\breason|work (it|this) out|show (your|the) work", re.I)
VERIFY = re.compile(r"\bverif|\bcheck|proposed answer|double[- ]check", re.I)
STRESS = re.compile(r"\bformat\b", re.I)
SUPPRESS = re.compile(r"no formatting|plain text|without (any )?format|ignore the (answer )?format", re.I)
DEMAND = "Answer format:"
CONFUSED = "I am not sure what is being asked."
HASTY = "Quick answer: "  # `careless` replies start so.
GUESS = "Not sure, guessing: "  # `variance` replies start so.
NOTE = "\n\nP.S. An earlier draft said: "  # `buried` replies end with this and a wrong answer.
_FILLER = ("First, restate what is given. Next, work through the quantities one at a time and keep track of "
           "each intermediate result. Then check the result against the question before answering. ")


@dataclasses.dataclass(frozen=True)
class _Entry:
    question: Question
    answer: str  # The raw answer content (no format wrapper).
    format: str | None  # The demanded answer format (formats.FORMATS), None if the task has none.
    accuracy: float  # Base accuracy of this task's questions.
    kinds: tuple[str, ...]  # The task's weaknesses (hljax/tasks/bottlenecks.py).


class SimulatedSolver:
    """`Generator` over the behaviour table; see the module docstring. Thread-safe."""

    simulated = True  # Read by run summaries and tables so they can say so.

    def __init__(self, tokenizer=None, seed: int = 0, behaviour: Behaviour = Behaviour()):
        """`tokenizer` counts and truncates reply tokens; default: the bundled byte-level BPE."""
        if tokenizer is None:
            import transformers

            from hljax.checkpoint.presets import TOKENIZER_DIR

            tokenizer = transformers.AutoTokenizer.from_pretrained(TOKENIZER_DIR)
        self.tokenizer = tokenizer
        self.seed = seed
        self.behaviour = behaviour
        self._by_line: dict[str, list[_Entry]] = {}
        self._counters: dict[bytes, int] = {}
        self._lock = threading.Lock()

    # ----- the trusted side -----

    def register(self, task: Task, questions: Sequence[Question]) -> None:
        """Make `questions` of `task` answerable. Called by the trusted side, never by the sandbox."""
        accuracy, kinds = self._profile(task)
        with self._lock:
            for q in questions:
                key = _key_line(q.text)
                entries = self._by_line.setdefault(key, [])
                if all(e.question.qid != q.qid for e in entries):
                    answer, fmt = _content(q)
                    entries.append(_Entry(q, answer, fmt, accuracy, kinds))

    def _profile(self, task: Task) -> tuple[float, tuple[str, ...]]:
        """Accuracy and weaknesses: a Reasoning Gym family's from its category and the bottleneck
        table; a plug-in task's from its TaskDef (`simulated_accuracy`, `simulated_weaknesses`); any
        other task's the default accuracy and none."""
        b = self.behaviour
        if isinstance(task, PluginTask):
            accuracy = task.simulated_accuracy
            return (b.default_accuracy if accuracy is None else accuracy), task.simulated_weaknesses
        if task.name.startswith("rg/"):
            return b.base_accuracy.get(category(task.name[3:]), b.default_accuracy), bottlenecks.kinds(task.name)
        return b.default_accuracy, ()

    # ----- Generator -----

    def generate(self, prompts: Sequence[str], sampling: SamplingParams, *, n: int = 1,
                 return_logprobs: bool = False) -> list[list[Completion]]:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        return [[self._complete(p, sampling, j, return_logprobs) for j in range(n)] for p in prompts]

    def chat(self, conversations: Sequence[Sequence[Message]], sampling: SamplingParams, *, n: int = 1,
             return_logprobs: bool = False, enable_thinking: bool = False) -> list[list[Completion]]:
        # The solver reads the whole conversation as one prompt; the roles carry no extra behaviour.
        prompts = ["\n\n".join(m["content"] for m in conv) for conv in conversations]
        return self.generate(prompts, sampling, n=n, return_logprobs=return_logprobs)

    # ----- one completion -----

    def _complete(self, prompt: str, sampling: SamplingParams, copy: int, return_logprobs: bool) -> Completion:
        entry = self._find(prompt)
        text = CONFUSED if entry is None else self._reply(entry, prompt, sampling, copy)
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        finish = "stop"
        if len(ids) > sampling.max_new_tokens:
            ids, finish = ids[: sampling.max_new_tokens], "length"
            text = self.tokenizer.decode(ids)
        return Completion(text=text, token_ids=tuple(ids), logprobs=tuple([0.0] * len(ids)) if return_logprobs else None,
                          finish_reason=finish, prompt_tokens=len(self.tokenizer.encode(prompt, add_special_tokens=False)),
                          weight_version="simulated")

    def _find(self, prompt: str) -> _Entry | None:
        """The question the prompt holds: one whose whole text is in it, else the first that shares its
        key line (questions of some families share their longest line, e.g. the instructions)."""
        first = None
        with self._lock:
            for line in prompt.splitlines():
                for entry in self._by_line.get(line.strip(), ()):
                    if entry.question.text in prompt:
                        return entry
                    first = first or entry
        return first

    def _rng(self, entry: _Entry, prompt: str, sampling: SamplingParams, copy: int) -> np.random.Generator:
        """A `variance` family's draws for one sample: fixed per question at temperature 0 (greedy is
        greedy whatever the wording), else fresh."""
        key = "" if sampling.temperature == 0 else prompt
        digest = hashlib.blake2b(f"{self.seed}|{entry.question.qid}|{key}".encode(), digest_size=16).digest()
        if sampling.temperature == 0:
            draw = 0
        elif sampling.seed is not None:
            draw = 1 + sampling.seed * 1009 + copy
        else:
            with self._lock:
                draw = self._counters.get(digest, 0) + 1
                self._counters[digest] = draw
            draw = -draw
        return np.random.default_rng([int.from_bytes(digest[:8], "little"), draw & (2**63 - 1), int(draw < 0)])

    def _reply(self, entry: _Entry, prompt: str, sampling: SamplingParams, copy: int) -> str:
        b = self.behaviour
        kinds = entry.kinds
        qid = entry.question.qid
        harness_text = _harness_text(prompt, entry.question.text)
        if "variance" in kinds:
            rng = self._rng(entry, prompt, sampling, copy)
            draw = lambda name: float(rng.uniform())  # noqa: E731 - every sample afresh.
        else:
            draw = lambda name: _unit(f"{self.seed}|{name}|{qid}")  # noqa: E731 - fixed per question.
        # A question's own difficulty, the same whatever the prompt: some questions are hard for everyone.
        z = _unit_normal(f"{self.seed}|difficulty|{qid}")
        p_right = _sigmoid(_logit(min(max(entry.accuracy, 0.01), b.max_accuracy)) + b.question_spread * z)
        n_wrong = b.near_misses
        if "variance" in kinds:
            p_right *= b.guess_scale
            n_wrong = b.guess_near_misses
        elif sampling.temperature > 0:
            p_right *= 1 - b.sampled_penalty
        checking = bool(VERIFY.search(harness_text))
        slipped = "careless" in kinds and _unit(f"{self.seed}|slip|{qid}") < (
            b.slip_rate_checked if checking else b.slip_rate)
        wrong_k = int(draw("which") * n_wrong)
        if slipped:
            content, wrong_k = _near_miss(entry.answer, 0, qid), 0  # The same slip every time.
        elif draw("right") < p_right and not (checking and "careless" not in kinds
                                                and draw("second guess") < b.second_guess_rate):
            content, wrong_k = entry.answer, -1
        else:
            content = _near_miss(entry.answer, wrong_k, qid)
        # Outside the demanded format an answer is written as a sentence, which no format accepts.
        sentence = entry.format is not None and draw("format") >= self._p_format(entry, prompt, harness_text)
        write = (lambda x: f"The answer is {x}.") if sentence else (FORMATS[entry.format].render if entry.format
                                                                     else (lambda x: x))
        body = write(content)
        if "careless" in kinds and not checking:
            body = HASTY + body
        if "variance" in kinds:
            body = GUESS + body
        if "buried" in kinds and _unit(f"{self.seed}|note|{qid}") < b.note_rate:
            decoy = _near_miss(entry.answer, (wrong_k + 1) % max(n_wrong, 2), qid)
            body += NOTE + write(decoy)
        if "truncation" in kinds or REASONING.search(harness_text):
            filler = (_FILLER * (1 + b.reasoning_tokens // 30))
            words = filler.split()[: b.reasoning_tokens]
            return "Let me think step by step. " + " ".join(words) + "\n\n" + body
        return body

    def _p_format(self, entry: _Entry, prompt: str, harness_text: str) -> float:
        """P(the reply is in the demanded format) for a question that demands one."""
        b = self.behaviour
        demand = _demand_line(entry.question.text)
        if SUPPRESS.search(harness_text):
            return b.format_suppressed
        if demand is not None and demand not in prompt:
            return b.format_missing
        if "format" in entry.kinds:
            return b.format_stressed if STRESS.search(harness_text) else b.format_weak
        return b.format_kept


# ----- helpers -----


def _content(q: Question) -> tuple[str, str | None]:
    """The raw answer and demanded format of a question: a Reasoning Gym entry's answer and format,
    else the reference as it stands."""
    if isinstance(q.payload, RGPayload):
        return str(q.payload.entry["answer"]), q.payload.format
    return q.answer, None


def _key_line(text: str) -> str:
    """The line that identifies a question in a prompt: its longest line that is not one of the
    phrasings every question shares (intro, format demand)."""
    lines = [line.strip() for line in text.splitlines()
             if line.strip() and not line.strip().startswith(DEMAND) and line.strip() not in INTROS]
    if not lines:
        raise ValueError("a question needs a non-empty line to be recognised by the simulated solver")
    return max(lines, key=len)


def _demand_line(text: str) -> str | None:
    for line in text.splitlines():
        if line.strip().startswith(DEMAND):
            return line.strip()
    return None


def _harness_text(prompt: str, question: str) -> str:
    """What the harness wrote around the question: the prompt without the question's own text."""
    if question in prompt:
        return prompt.replace(question, " ")
    lines = {line.strip() for line in question.splitlines() if line.strip()}
    return "\n".join(line for line in prompt.splitlines() if line.strip() not in lines)


def _near_miss(answer: str, k: int, qid: str) -> str:
    """A plausible wrong answer, the k-th of a question's few, distinct for distinct k (as far as the
    answer allows): a number off by a little, else a character dropped or two swapped."""
    numbers = list(re.finditer(r"-?\d+", answer))
    if numbers:
        m = numbers[int(_unit(f"{qid}|num|{k}") * len(numbers))]
        value = int(m.group())
        delta = (1, -1, 10, 2, -2, -10, 3, -3, 100)[k % 9] * (1 + k // 9)
        out = answer[: m.start()] + str(value + delta) + answer[m.end():]
        return out if out != answer else answer + "0"
    if len(answer) < 2:
        return answer + "x" * (k + 1)
    edits = {answer[:i] + answer[i + 1] + answer[i] + answer[i + 2:] for i in range(len(answer) - 1)}
    edits |= {answer[:i] + answer[i + 1:] for i in range(len(answer))}
    edits.discard(answer)
    ordered = sorted(edits, key=lambda e: _unit(f"{qid}|miss|{e}"))
    return ordered[k % len(ordered)] if ordered else answer + "x"


def _unit(key: str) -> float:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") / 2**64


def _unit_normal(key: str) -> float:
    u1, u2 = max(_unit(key + "|a"), 1e-12), _unit(key + "|b")
    return math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * u2)


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def _logit(p: float) -> float:
    return math.log(p / (1 - p))
