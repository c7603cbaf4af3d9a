"""Watch this process for any file access under the real home folder (design.md: "nothing reads or writes the
user's home"), so a test that reaches it fails, whatever path it took there.

An audit hook (PEP 578) sees every open, listdir, mkdir, rename and remove. Paths Python itself runs from
(its prefix and sys.path, which may lie under the home, as with pyenv) are not the user's files and are
let through. Child processes are not watched: they inherit the temporary HOME and caches conftest.py sets,
so a test that starts one must pass it the environment of the moment (`os.environ` at call time, not a copy
taken at import).
"""

from __future__ import annotations

import os
import sys

REAL_HOME = os.path.abspath(os.path.expanduser("~"))  # read on import, before any test replaces HOME
EVENTS = {"open", "os.listdir", "os.scandir", "os.mkdir", "os.rename", "os.remove", "os.rmdir", "shutil.rmtree",
          "os.chmod", "os.truncate"}
_RUNTIME = tuple(os.path.abspath(p) + os.sep for p in {sys.prefix, sys.base_prefix, sys.exec_prefix, *sys.path,
                                                        os.environ.get("PYENV_ROOT", "")} if p)
touched: list[tuple[str, str]] = []  # (event, path) under the real home, in order
_installed: list = []


def in_real_home(path: str) -> bool:
    """Under the real home and not part of the Python installation."""
    full = os.path.abspath(path)
    home = REAL_HOME.rstrip(os.sep) + os.sep
    return (full + os.sep).startswith(home) and not (full + os.sep).startswith(_RUNTIME)


def _hook(event: str, args: tuple) -> None:
    if event not in EVENTS or not args:
        return
    path = args[0]
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    elif isinstance(path, os.PathLike):
        path = os.fspath(path)
    if isinstance(path, str) and in_real_home(path):
        touched.append((event, os.path.abspath(path)))


def install() -> None:
    """Start watching (once per process: audit hooks cannot be removed)."""
    if _hook not in _installed:
        sys.addaudithook(_hook)
        _installed.append(_hook)

