"""Surface formats for "format-varied" questions: instruction phrasing plus an answer-format demand.

Each question is rendered with one intro phrasing and one answer format, chosen by hashing its id
with a format seed. The format says how the final answer must be delimited; the task extracts the
answer that way before scoring it, so an answer in the requested format is accepted and one that
ignores it scores 0. `AnswerFormat.render` writes an answer in the format (the reference rendered this way must
score 1.0: the tests check it for every family and format).
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Callable

from hljax.tasks.splits import unit_hash

INTROS = (
    "Solve the following problem.",
    "Here is a task for you.",
    "Read the problem below carefully and answer it.",
    "Work out the answer to this question.",
)


@dataclasses.dataclass(frozen=True)
class AnswerFormat:
    """How the final answer must be written, and how it is read back."""

    name: str
    summary: str  # The demand in a few words, for task descriptions.
    phrasings: tuple[str, ...]  # Ways of stating the demand; one is chosen per question.
    render: Callable[[str], str]  # Answer -> a response in this format.
    extract: Callable[[str], str | None]  # Response -> the answer, or None if the format is not followed.


def _render_tags(answer: str) -> str:
    return f"<answer>{answer}</answer>"


def _extract_tags(response: str) -> str | None:
    found = re.findall(r"<answer>(.*?)</answer>", response, flags=re.DOTALL)
    return found[-1].strip() if found else None


_FINAL = re.compile(r"final answer\s*:", flags=re.IGNORECASE)


def _render_final(answer: str) -> str:
    return f"Final answer: {answer}"


def _extract_final(response: str) -> str | None:
    # Everything after the last marker, so multi-line answers (grids) survive.
    matches = list(_FINAL.finditer(response))
    return response[matches[-1].end() :].strip() if matches else None


def _render_boxed(answer: str) -> str:
    return "\\boxed{" + answer + "}"


def _extract_boxed(response: str) -> str | None:
    start = response.rfind("\\boxed{")
    if start < 0:
        return None
    body_start = start + len("\\boxed{")
    depth = 1
    for i in range(body_start, len(response)):
        if response[i] == "{":
            depth += 1
        elif response[i] == "}":
            depth -= 1
            if depth == 0:
                return response[body_start:i].strip()
    # Unbalanced braces inside the answer: take up to the last closing brace.
    end = response.rfind("}")
    return response[body_start:end].strip() if end >= body_start else None


_JSON_STARTS = 256


def _render_json(answer: str) -> str:
    return json.dumps({"answer": answer}, ensure_ascii=False)


def _extract_json(response: str) -> str | None:
    decoder = json.JSONDecoder()
    # The last object with an "answer" key wins, as for the other formats. Only the last
    # _JSON_STARTS opening braces are tried, so a hostile answer cannot make this quadratic.
    starts = [m.start() for m in re.finditer(r"\{", response)][-_JSON_STARTS:]
    for start in reversed(starts):
        try:
            value, _ = decoder.raw_decode(response, start)
        except ValueError:
            continue
        if isinstance(value, dict) and "answer" in value:
            answer = value["answer"]
            return answer.strip() if isinstance(answer, str) else json.dumps(answer)
    return None


def _extract_bare(response: str) -> str | None:
    return response.strip()


FORMATS: dict[str, AnswerFormat] = {
    f.name: f
    for f in (
        AnswerFormat(
            "answer_tags",
            "wrapped in <answer></answer> tags",
            (
                "Put your final answer between <answer> and </answer> tags.",
                "Wrap the final answer in <answer></answer> tags; only the text inside the tags is graded.",
            ),
            _render_tags,
            _extract_tags,
        ),
        AnswerFormat(
            "final_line",
            "after 'Final answer:'",
            (
                "End your reply with the line 'Final answer: ' followed by your answer.",
                "Finish with 'Final answer: <your answer>'; everything after that marker is graded.",
            ),
            _render_final,
            _extract_final,
        ),
        AnswerFormat(
            "boxed",
            "inside \\boxed{}",
            (
                "Give your final answer inside \\boxed{}.",
                "Write the final answer as \\boxed{answer}; only the boxed text is graded.",
            ),
            _render_boxed,
            _extract_boxed,
        ),
        AnswerFormat(
            "json",
            'as a JSON object {"answer": ...}',
            (
                'Reply with a JSON object of the form {"answer": "<your answer>"}.',
                'End with a JSON object {"answer": ...} holding the final answer as a string.',
            ),
            _render_json,
            _extract_json,
        ),
        AnswerFormat(
            "bare",
            "as the whole reply",
            (
                "Reply with the final answer only: no explanation, no extra text.",
                "Your whole reply is graded as the answer, so write nothing but the answer.",
            ),
            lambda answer: answer,
            _extract_bare,
        ),
    )
}


def check_format_names(names: tuple[str, ...]) -> None:
    """ValueError unless `names` is a non-empty tuple of known, distinct format names."""
    if not names:
        raise ValueError("at least one answer format is needed")
    unknown = [n for n in names if n not in FORMATS]
    if unknown:
        raise ValueError(f"unknown answer formats {unknown}; valid: {sorted(FORMATS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"answer formats repeat: {names}")


def choose_format(qid: str, seed: int, formats: tuple[str, ...]) -> str:
    """The answer format of question `qid`: a seeded, per-question choice among `formats`."""
    return formats[int(unit_hash(seed, qid, "format") * len(formats))]


def render_question(problem: str, qid: str, seed: int, fmt: str) -> str:
    """The question text: a seeded intro, the problem, then format `fmt`'s demand in a seeded phrasing."""
    phrasings = FORMATS[fmt].phrasings
    intro = INTROS[int(unit_hash(seed, qid, "intro") * len(INTROS))]
    demand = phrasings[int(unit_hash(seed, qid, "phrasing") * len(phrasings))]
    return f"{intro}\n\n{problem.strip()}\n\nAnswer format: {demand}"
