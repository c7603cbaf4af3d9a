"""One raw reading of the recording: the text a file held, or why it could not be read.

A check that meets an unreadable reading says "unknown" and gives the reason; it never guesses. Keeping the
reason in the recording (not an exception at read time) is what lets a replay reach the same verdicts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

UNREADABLE = "unreadable"  # the key of a reading that failed: {"unreadable": "why"}
MAX_READING_BYTES = 1 << 16  # sysfs and procfs attribute files are one page at most


def unreadable(why: str) -> dict[str, str]:
    return {UNREADABLE: why}


def is_unreadable(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == {UNREADABLE}


def why_unreadable(value: Any) -> str:
    return value[UNREADABLE] if is_unreadable(value) else ""


def read_text(path: Path) -> str | dict[str, str]:
    """The stripped text of a sysfs/procfs file, or {"unreadable": why} (missing, no permission, an I/O error
    such as EINVAL, which some attributes give when the device has no such property)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_READING_BYTES)
    except OSError as error:
        return unreadable(f"{path}: {error.strerror or error}")
    return data.decode("utf-8", "replace").strip()
