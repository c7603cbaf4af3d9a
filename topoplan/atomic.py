"""Write output files all-or-nothing: into a temporary file beside the target, renamed over it at the end,
so an interrupted or failed run never leaves a half-written file behind."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from topoplan.errors import TopoplanError


def check_folder(path: str | Path) -> Path:
    """Refuse an output path that cannot be written (its folder missing or not writable, or the path itself a
    directory), before any time is spent computing what goes in it."""
    path = Path(path)
    if not path.parent.is_dir():
        raise TopoplanError("the folder does not exist", source=path.parent)
    if path.is_dir():
        raise TopoplanError("is a directory; expected a file name to write", source=path)
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise TopoplanError("the folder is not writable", source=path.parent)
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(output: str | Path, *, executable: bool = False) -> Iterator[str]:
    """A temporary path to write to; it becomes `output` when the block ends without an exception.

    `output` gets the mode a plain open() would give it (less the umask), executable by all if asked.
    """
    target = Path(output)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as error:
        raise TopoplanError(f"cannot write {output}: {error.strerror}") from None
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, (0o777 if executable else 0o666) & ~_umask())  # mkstemp makes it private
        os.replace(tmp, target)
    except OSError as error:
        raise TopoplanError(f"cannot write {output}: {error.strerror}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@contextmanager
def exclusive_lock(path: str | Path) -> Iterator[None]:
    """Hold an exclusive lock on the file `path` (created if missing) for the block, waiting for any other
    holder: one process at a time builds what others will read. The kernel drops the lock if the holder dies."""
    import fcntl

    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def write_atomic(output: str | Path, data: str | bytes, *, executable: bool = False) -> None:
    """Write text (UTF-8) or bytes to `output` all-or-nothing."""
    with atomic_path(output, executable=executable) as tmp:
        Path(tmp).write_bytes(data.encode() if isinstance(data, str) else data)
