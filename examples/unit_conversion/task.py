"""A task of your own, in one file (docs/tasks.md): unit conversions scored with a tolerance.

    python -m launch.adapt --config examples/unit_conversion/adapt.py

Nothing in hljax knows this task: the questions are a JSONL file beside this one, the scorer is the
function below, the seed harness is seed_harness.py. Paths are relative to this file.
"""

import re

from hljax.tasks.plugin import TaskDef

_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")


def score(answer: str, reference: float) -> float:
    """1 within 0.5% of the reference, 0.5 within 5%, else 0; the answer's last number counts, so a
    reply that ends with another number is wrong. Runs in the scorer sandbox on harness answers."""
    numbers = _NUMBER.findall(answer)
    if not numbers:
        return 0.0
    value = float(numbers[-1].replace(",", ""))
    error = abs(value - reference) / max(abs(reference), 1e-9)
    return 1.0 if error <= 0.005 else 0.5 if error <= 0.05 else 0.0


TASK = TaskDef(
    name="unit_conversion",
    description=(
        "Unit conversion: each question asks to convert a quantity between two units (lengths, masses, "
        "volumes, areas). The harness's return value is graded by its last number: full marks within 0.5% "
        "of the exact conversion, half within 5%, else 0."
    ),
    questions="questions.jsonl",
    score=score,
    seed_harness="seed_harness.py",
    # For the simulated solver (the CPU stand-in for an LLM) only: it reasons at length before every
    # answer, so a too-small token budget cuts its replies (the weakness this example's harness has to fix).
    simulated_accuracy=0.6,
    simulated_weaknesses=("truncation",),
)
