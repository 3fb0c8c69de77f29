"""Append-only JSONL files (metrics, rollouts, collected rows): one JSON object a line, each written
whole with its newline, so only a last line without its newline can be torn (a write still under way,
or one a crash cut short).

`read` leaves a torn last line out; the file's own writer, resuming, passes `cut_torn=True` to cut it
off the file before appending again (else the next row would be glued onto the torn one). A bad line
anywhere else is damage no crash makes: an error naming the file and line.
"""

from __future__ import annotations

import json
import logging
import os

log = logging.getLogger(__name__)


def read(path: str, *, cut_torn: bool = False) -> list[dict]:
    """The rows of `path` ([] if it does not exist); `cut_torn`: truncate a torn last line, with a warning."""
    if not os.path.exists(path):
        return []
    with open(path, "rb") as f:
        data = f.read()
    rows, good_end, torn = _parse(path, data)
    if torn and cut_torn:
        log.warning("%s:%d: cutting a torn last line (%s)", path, *torn)
        with open(path, "r+b") as f:
            f.truncate(good_end)
    return rows


def _parse(path: str, data: bytes) -> tuple[list[dict], int, tuple[int, str] | None]:
    """(rows, byte offset where the whole rows end, (line number, why) of a torn last line or None)."""
    lines = data.split(b"\n")
    rows, good_end = [], 0
    for n, line in enumerate(lines, 1):
        last = n == len(lines)  # No newline after it.
        if not line.strip():
            good_end += len(line) + (not last)
            continue
        try:
            row = json.loads(line)
            if last:
                raise ValueError("no newline at its end")
        except ValueError as e:
            if last:
                return rows, good_end, (n, str(e))
            raise ValueError(f"{path}:{n}: not a JSON row ({e})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{n}: a row must be a JSON object, not {type(row).__name__}")
        rows.append(row)
        good_end += len(line) + 1
    return rows, good_end, None
