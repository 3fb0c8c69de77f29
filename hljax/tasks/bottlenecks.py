"""Which weakness of the simulated solver (a stand-in for an LLM on CPU) each Reasoning Gym family
has: one table, fixed before any held-out score was measured (issue 33), not tuned after.

Each kind is a way the stand-in solver fails on a family, with its own symptom in the execution
report and its own fix in the harness (`hljax/tasks/simulated_solver.py` does what the solver side
says; `hljax/data/harness_fixes.py` writes the fixes):

| kind | what the solver does on such a family | what the report shows | what fixes it |
|---|---|---|---|
| format | writes the answer as a sentence unless the prompt insists on the format | `The answer is 42.` scored 0 | a prompt that insists on the answer format |
| truncation | reasons at length before every answer | a reply cut inside `Let me think step by step...`, completion tokens at the call's cap | a larger `max_new_tokens` |
| careless | answers hastily and slips (the same slip every time) | `Quick answer:` and an answer one character or digit off | a second call that checks the proposed answer |
| variance | guesses: each sample drawn afresh, wrong ones scattered | `Not sure, guessing:` | several samples at temperature > 0 and a majority vote |
| buried | adds a note with a second, wrong answer after the real one | `P.S. An earlier draft said: ...` after the answer | cutting the reply at the note |

A fix does nothing for another kind, so no single edit is best everywhere; some cost solver calls or
tokens (a check doubles the calls, a vote takes five). Every RL family has one kind, one family per
kind, so GRPO can tie each symptom to its fix; the held-out families have one kind or two (every
pair once), so doing well there takes reading the report, not remembering a family. SFT families
show every kind and pair too, but the SFT data picks fixes uniformly, whatever the report shows.
"""

from __future__ import annotations

from hljax.tasks import rg_families

KINDS = ("format", "truncation", "careless", "variance", "buried")

BOTTLENECKS: dict[str, tuple[str, ...]] = {
    # SFT: every kind twice alone, every pair once, one family without a weakness.
    "basic_arithmetic": ("format",), "chain_sum": ("truncation",), "decimal_arithmetic": ("careless",),
    "fraction_simplification": ("variance",), "gcd": ("buried",), "lcm": ("format",), "prime_factorization": ("truncation",),
    "products": ("careless",), "power_function": ("variance",), "bitwise_arithmetic": ("buried",),
    "count_bits": ("format", "truncation"), "leg_counting": ("format", "careless"), "number_format": ("format", "variance"),
    "base_conversion": ("format", "buried"), "caesar_cipher": ("truncation", "careless"),
    "letter_counting": ("truncation", "variance"), "number_sorting": ("truncation", "buried"),
    "spell_backward": ("careless", "variance"), "word_sorting": ("careless", "buried"),
    "word_sequence_reversal": ("variance", "buried"), "complex_arithmetic": (),
    # RL: one family per kind.
    "calendar_arithmetic": ("format",), "gsm_symbolic": ("truncation",), "simple_equations": ("careless",),
    "count_primes": ("variance",), "number_filtering": ("buried",),
    # Held out: every pair once, every kind alone two or three times.
    "aiw": ("format",), "needle_haystack": ("format",), "tsumego": ("truncation",), "simple_geometry": ("truncation",),
    "maze": ("careless",), "shortest_path": ("careless",), "arc_1d": ("careless",), "circuit_logic": ("variance",),
    "course_schedule": ("variance",), "n_queens": ("buried",), "color_cube_rotation": ("buried",),
    "mini_sudoku": ("format", "truncation"), "family_relationships": ("format", "careless"),
    "survo": ("format", "variance"), "syllogism": ("format", "buried"), "knights_knaves": ("truncation", "careless"),
    "path_star": ("truncation", "variance"), "largest_island": ("truncation", "buried"),
    "modulo_grid": ("careless", "variance"), "kakurasu": ("careless", "buried"), "rectangle_count": ("variance", "buried"),
}  # fmt: skip


def kinds(task_name: str) -> tuple[str, ...]:
    """The weaknesses of a task (`rg/<family>`); none for a family or task outside the table."""
    family = task_name[3:] if task_name.startswith("rg/") else None
    return BOTTLENECKS.get(family, ()) if family else ()


def check() -> None:
    """ValueError unless every listed family has an entry of known kinds (tests call it)."""
    listed = rg_families.SFT + rg_families.RL + rg_families.HELDOUT
    missing = sorted(set(listed) - set(BOTTLENECKS))
    extra = sorted(set(BOTTLENECKS) - set(listed))
    unknown = sorted({k for ks in BOTTLENECKS.values() for k in ks} - set(KINDS))
    if missing or extra or unknown:
        raise ValueError(f"bottleneck table: families missing {missing}, not listed {extra}, unknown kinds {unknown}")
