"""Writing result files atomically: a temp file in the same folder, renamed over the target, so a failure
never leaves a half-written calibration or chart behind."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from topoplan.errors import TopoplanError


def check_folder(path: str | Path) -> Path:
    """Refuse an output path whose folder does not exist, before any measurement is spent on it."""
    path = Path(path)
    if not path.parent.is_dir():
        raise TopoplanError("the folder does not exist", source=path.parent)
    return path


def write_atomic(path: str | Path, text: str) -> Path:
    path = check_folder(path)
    folder = path.parent
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=folder)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path
