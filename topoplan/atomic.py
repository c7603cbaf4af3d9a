"""Write output files all-or-nothing: into a temporary file beside the target, renamed over it at the end,
so an interrupted or failed run never leaves a half-written file behind.

Two kinds of target are not files to replace: a character device or a FIFO (`-o /dev/stdout`, `-o /dev/full`,
a named pipe) is written through, as a shell's `>` would; a symlink is followed, so the link stays and the file
it points to is replaced (docs/limits.md) -- except a link another user planted in a sticky world-writable folder
such as /tmp, which the kernel's protected_symlinks rule would not follow either. A file replaced keeps no wider
a mode than it had."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from topoplan.errors import TopoplanError

MIN_FREE_BYTES = 1 << 20  # every output topoplan writes (scripts, JSON, SVG, calibrations) is well under 1 MiB


def _is_stream(path: Path) -> bool:
    """A character device or FIFO: written through, never replaced by a regular file."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)


MAX_LINKS = 40  # symlinks followed for one path, as Linux's own limit (ELOOP beyond)


def _target(output: str | Path) -> Path:
    """The file a write lands in: symlinks followed (each checked as protected_symlinks would), a loop, an
    over-long name or an empty name refused in one line."""
    if not str(output).strip():
        raise TopoplanError("an empty output path; expected a file name (leave the option out to print)")
    path = Path(output)
    try:
        for _ in range(MAX_LINKS):
            if not path.is_symlink():
                return path
            _refuse_planted_link(path)
            path = path.parent / os.readlink(path)
    except OSError as error:
        raise TopoplanError(f"cannot write to it: {error.strerror or error}", source=output) from None
    raise TopoplanError(f"more than {MAX_LINKS} symbolic links to follow (a loop?); expected a file to write",
                        source=output)


def _refuse_planted_link(link: Path) -> None:
    """Refuse to follow `link` where the kernel's protected_symlinks rule would: in a sticky, world-writable
    folder (/tmp), a link owned neither by us nor by the folder's owner may have been planted to make us
    overwrite a file of our own (as root: any file)."""
    folder, owner = os.stat(link.parent), os.lstat(link).st_uid
    shared = folder.st_mode & stat.S_ISVTX and folder.st_mode & stat.S_IWOTH
    if shared and owner not in (os.geteuid(), folder.st_uid):
        raise TopoplanError(f"a symbolic link owned by another user (uid {owner}) in a shared sticky folder; not "
                            "followed (the kernel's protected_symlinks rule): remove it or write elsewhere",
                            source=link)


def check_folder(path: str | Path) -> Path:
    """Refuse an output path that cannot be written (its folder missing, not writable or full, the path
    itself a directory or empty), before any time is spent computing what goes in it."""
    path = _target(path)
    if _is_stream(path):
        return path
    if not path.parent.is_dir():
        raise TopoplanError("the folder does not exist", source=path.parent)
    if path.is_dir():
        raise TopoplanError("is a directory; expected a file name to write", source=path)
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise TopoplanError("the folder is not writable", source=path.parent)
    fs = os.statvfs(path.parent)
    if fs.f_bavail * fs.f_frsize < MIN_FREE_BYTES:
        raise TopoplanError(f"{fs.f_bavail * fs.f_frsize} bytes free on its file system; expected at least "
                            f"{MIN_FREE_BYTES >> 20} MiB", source=path.parent)
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _mode(target: Path, executable: bool) -> int:
    """What a plain open() would give a new file (less the umask), executable by all if asked; never wider than
    the mode of the file it replaces (a 0600 file stays private whatever is written over it)."""
    mode = (0o777 if executable else 0o666) & ~_umask()
    try:
        return mode & os.stat(target).st_mode & 0o777
    except FileNotFoundError:
        return mode


@contextmanager
def atomic_path(output: str | Path, *, executable: bool = False) -> Iterator[str]:
    """A temporary path to write to; it becomes `output` when the block ends without an exception.

    `output` gets the mode a plain open() would give it (less the umask), executable by all if asked.
    """
    target = _target(output)
    if _is_stream(target):
        try:
            yield str(target)
        except OSError as error:
            raise TopoplanError(f"cannot write {output}: {error.strerror}") from None
        return
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as error:
        raise TopoplanError(f"cannot write {output}: {error.strerror}") from None
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, _mode(target, executable))  # mkstemp makes it private
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
