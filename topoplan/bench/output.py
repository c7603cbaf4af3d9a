"""Writing result files atomically: a temp file in the same folder, renamed over the target, so a failure
never leaves a half-written calibration or chart behind."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from topoplan.errors import TopoplanError


def write_atomic(path: str | Path, text: str) -> Path:
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise TopoplanError("the folder does not exist", source=folder)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=folder)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path
