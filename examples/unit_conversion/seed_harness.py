"""Seed harness of the unit-conversion example: one solver call with the question, as in the paper."""


def solve(question: str, solver) -> str:
    return solver.generate(question).strip()
