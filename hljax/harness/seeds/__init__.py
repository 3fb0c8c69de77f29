"""Seed harnesses: the starting point h_0 of revision. Each file is a harness module (as text)."""

from __future__ import annotations

from pathlib import Path

_DIR = Path(__file__).parent
NAMES = ("reasoning", "multihop_qa")


def load(name: str) -> str:
    """The source of seed harness `name` (one of NAMES)."""
    if name not in NAMES:
        raise ValueError(f"unknown seed harness {name!r}; known: {NAMES}")
    return (_DIR / f"{name}.py").read_text()
