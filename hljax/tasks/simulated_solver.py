"""A simulated solver: a STAND-IN FOR AN LLM, for CPU runs and tests, never a model of any real one.

No pretrained weights can be had on a CPU-only machine, and a random tiny model scores 0 on every
question whatever the harness does, so harness learning cannot be seen with it. `SimulatedSolver`
implements the `Generator` protocol and answers from the question's reference, with a seeded
accuracy model keyed to generic harness behaviour (what the prompt asks for and how it is sampled),
never to any particular edit text. Everything it does is in `Behaviour`, one table:

- It recognises a question by a line of the question's text appearing in the prompt. The trusted
  side registers every question it sends to the sandbox (`hljax.tasks.jobs.announce`); references
  stay in this process and never enter the sandbox. A prompt holding no registered question gets a
  fixed confused reply.
- Accuracy: a base per reasoning-gym category (`base_accuracy`), shifted per question by a seeded
  difficulty; raised when the prompt asks for step-by-step reasoning (`reasoning_bonus`) or for a
  check of a proposed answer (`verify_bonus`); lowered for a sampled (temperature > 0) answer
  (`sampled_penalty`).
- Format: the answer is written in the question's demanded format with probability
  `format_stated` when the demand is only part of the question, `format_stressed` when the prompt
  also insists on the format, `format_missing` when the demand was cut out of the prompt, and
  `format_suppressed` when the prompt asks for plain text or no formatting. Otherwise the answer
  is written as a sentence, which no format accepts.
- Reasoning costs tokens: a reply that reasons first needs about `reasoning_tokens` tokens before
  the answer, so a too-small `max_new_tokens` truncates the reply before the answer.
- Wrong answers are plausible near-misses (a digit or a character off), `near_misses` distinct ones
  per question, so voting can also agree on a wrong answer.
- temperature 0: a fixed answer for a given prompt. temperature > 0: independent samples (the
  request's seed, or a per-prompt counter when none is given), so majority voting helps.

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
from hljax.tasks.base import Question, Task
from hljax.tasks.formats import FORMATS, INTROS
from hljax.tasks.reasoning_gym import RGPayload, category

LABEL = "simulated solver (a stand-in for an LLM on CPU; scores are not a real model's)"


@dataclasses.dataclass(frozen=True)
class Behaviour:
    """The simulated solver's whole behaviour table. Accuracies are probabilities of a right answer."""

    # Base accuracy of a greedy answer to the bare question, per reasoning-gym category (the task
    # name's family's package); other tasks (multi-hop QA) get `default_accuracy`.
    base_accuracy: Mapping[str, float] = dataclasses.field(default_factory=lambda: {
        "arithmetic": 0.45, "algorithmic": 0.45, "algebra": 0.40, "games": 0.25, "logic": 0.40,
        "graphs": 0.30, "cognition": 0.35, "geometry": 0.35, "arc": 0.20,
    })
    default_accuracy: float = 0.35
    question_spread: float = 1.0  # Std of a question's difficulty, in logits: questions differ.
    reasoning_bonus: float = 0.25  # Prompt asks to think step by step / reason / work it out.
    verify_bonus: float = 0.15  # Prompt asks to check or verify a proposed answer.
    sampled_penalty: float = 0.05  # A temperature > 0 sample is a little worse than the greedy answer.
    max_accuracy: float = 0.95
    format_stated: float = 0.55  # P(demanded format) when the demand is only in the question.
    format_stressed: float = 0.95  # ...when the prompt also insists on the format.
    format_missing: float = 0.10  # ...when the question's demand was cut out of the prompt.
    format_suppressed: float = 0.05  # ...when the prompt asks for plain text / no formatting.
    reasoning_tokens: int = 96  # Tokens of reasoning written before the answer when asked to reason.
    near_misses: int = 2  # Distinct wrong answers per question.


REASONING = re.compile(r"step[- ]by[- ]step|\bthink\b|\breason|work (it|this) out|show (your|the) work", re.I)
VERIFY = re.compile(r"\bverif|\bcheck|proposed answer|double[- ]check", re.I)
STRESS = re.compile(r"\bformat\b", re.I)
SUPPRESS = re.compile(r"no formatting|plain text|without (any )?format|ignore the (answer )?format", re.I)
DEMAND = "Answer format:"
CONFUSED = "I am not sure what is being asked."
_FILLER = ("First, restate what is given. Next, work through the quantities one at a time and keep track of "
           "each intermediate result. Then check the result against the question before answering. ")


@dataclasses.dataclass(frozen=True)
class _Entry:
    question: Question
    answer: str  # The raw answer content (no format wrapper).
    format: str | None  # The demanded answer format (formats.FORMATS), None if the task has none.
    accuracy: float  # Base accuracy of this task's questions.


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
        accuracy = self._task_accuracy(task.name)
        with self._lock:
            for q in questions:
                key = _key_line(q.text)
                entries = self._by_line.setdefault(key, [])
                if all(e.question.qid != q.qid for e in entries):
                    answer, fmt = _content(q)
                    entries.append(_Entry(q, answer, fmt, accuracy))

    def _task_accuracy(self, name: str) -> float:
        b = self.behaviour
        if name.startswith("rg/"):
            return b.base_accuracy.get(category(name[3:]), b.default_accuracy)
        return b.default_accuracy

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
        with self._lock:
            for line in prompt.splitlines():
                found = self._by_line.get(line.strip())
                if found:
                    return found[0]
        return None

    def _rng(self, entry: _Entry, prompt: str, sampling: SamplingParams, copy: int) -> np.random.Generator:
        digest = hashlib.blake2b(f"{self.seed}|{entry.question.qid}|{prompt}".encode(), digest_size=16).digest()
        if sampling.temperature == 0:
            draw = 0  # Greedy: one fixed answer per prompt.
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
        rng = self._rng(entry, prompt, sampling, copy)
        harness_text = _harness_text(prompt, entry.question.text)
        reasoning = bool(REASONING.search(harness_text))
        accuracy = entry.accuracy
        accuracy += b.reasoning_bonus if reasoning else 0.0
        accuracy += b.verify_bonus if VERIFY.search(harness_text) else 0.0
        accuracy -= b.sampled_penalty if sampling.temperature > 0 else 0.0
        accuracy = min(max(accuracy, 0.01), b.max_accuracy)
        # A question's own difficulty, the same whatever the prompt: some questions are hard for everyone.
        z = _unit_normal(f"{self.seed}|difficulty|{entry.question.qid}")
        p_right = _sigmoid(_logit(accuracy) + b.question_spread * z)
        right = rng.uniform() < p_right
        content = entry.answer if right else _near_miss(entry.answer, int(rng.integers(b.near_misses)),
                                                        entry.question.qid)
        if entry.format is None:
            body = content
        else:
            demand = _demand_line(entry.question.text)
            if SUPPRESS.search(harness_text):
                p_format = b.format_suppressed
            elif demand is not None and demand not in prompt:
                p_format = b.format_missing
            elif STRESS.search(harness_text):
                p_format = b.format_stressed
            else:
                p_format = b.format_stated
            body = FORMATS[entry.format].render(content) if rng.uniform() < p_format else f"The answer is {content}."
        if reasoning:
            filler = (_FILLER * (1 + b.reasoning_tokens // 30))
            words = filler.split()[: b.reasoning_tokens]
            return "Let me think step by step. " + " ".join(words) + "\n\n" + body
        return body


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
    """A plausible wrong answer, the k-th of a question's few: a number off by a little, else a
    character dropped or two swapped."""
    numbers = list(re.finditer(r"-?\d+", answer))
    if numbers:
        m = numbers[int(_unit(f"{qid}|num|{k}") * len(numbers))]
        value = int(m.group())
        delta = (1, -1, 10, 2)[k % 4] * (1 + k // 4)
        out = answer[: m.start()] + str(value + delta) + answer[m.end():]
    elif len(answer) >= 2:
        i = int(_unit(f"{qid}|pos|{k}") * (len(answer) - 1))
        out = answer[:i] + answer[i + 1] + answer[i] + answer[i + 2:] if k % 2 == 0 else answer[:i] + answer[i + 1:]
    else:
        out = answer + "x"
    return out if out != answer else answer + ("0" if k % 2 else "x")


def _unit(key: str) -> float:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") / 2**64


def _unit_normal(key: str) -> float:
    u1, u2 = max(_unit(key + "|a"), 1e-12), _unit(key + "|b")
    return math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * u2)


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def _logit(p: float) -> float:
    return math.log(p / (1 - p))
