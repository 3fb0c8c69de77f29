"""Which command wrote an output folder, so that a command replaces nothing but its own outputs.

Every folder hljax writes whole (an HF export, a random init, a weight sync) carries `MARKER`, a small
JSON file naming its writer. An existing path (but an empty folder) is replaced only when the caller
allows it (a launcher's --overwrite) and the marker there names the same writer: a run directory, a
user's model, a file, or another command's output is refused even then. A folder without the marker
(written before markers, or made by hand) is nobody's output: moving it aside is the user's call.
"""

from __future__ import annotations

import json
import os

MARKER = "hljax-output.json"


class OutputExists(FileExistsError):
    """The output path exists and may not be replaced; the message names the path and what allows it."""


def mark(folder: str, writer: str) -> None:
    """Stamp `folder` (being written) as `writer`'s output."""
    with open(os.path.join(folder, MARKER), "w") as f:
        json.dump({"written_by": writer}, f)
        f.write("\n")


def writer_of(path: str) -> str | None:
    """The writer `path`'s marker names; None for a file, a link, or a folder without a readable marker."""
    marker = os.path.join(path, MARKER)
    if os.path.islink(path) or not os.path.isdir(path) or not os.path.isfile(marker):
        return None
    try:
        with open(marker) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    return record.get("written_by") if isinstance(record, dict) else None


def check_replaceable(path: str, writer: str, replace: bool, flag: str | None = "--overwrite") -> None:
    """Raise OutputExists unless `path` is free, or `replace` (what `flag` sets; None: no flag, the
    caller always replaces its own) and `writer` wrote it. An empty folder is free: nothing is lost."""
    if not os.path.lexists(path) or _empty_folder(path):
        return
    if not replace:
        raise OutputExists(f"{path} exists: {flag} replaces it if it is an earlier {writer} output, and "
                           f"nothing else; or choose another path")
    found = writer_of(path)
    if found != writer:
        what = f"a {found} output" if found else f"not a {writer} output (no {MARKER} naming it)"
        even = f", even with {flag}" if flag else ""
        raise OutputExists(f"{path} is {what}: {writer} will not replace it{even}; choose another path, or "
                           f"move it aside yourself")


def _empty_folder(path: str) -> bool:
    return os.path.isdir(path) and not os.path.islink(path) and not os.listdir(path)
