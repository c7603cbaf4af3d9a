"""The test suite's own isolation (conftest.py, home_guard.py): a temporary home and cache per test, and a
test that reaches the real home fails."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import home_guard
import pytest

from topoplan.runner.builtin import builtin_cache_folder


def test_home_and_caches_are_temporary(isolated_home: Path):
    real = Path(home_guard.REAL_HOME)
    assert Path.home() == isolated_home != real
    for name in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME"):
        assert Path(os.environ[name]).parent == isolated_home
    assert "TOPOPLAN_CACHE" not in os.environ
    assert builtin_cache_folder("tiny") == isolated_home / ".cache" / "topoplan" / "models" / "tiny-seed0"


def test_each_test_gets_a_fresh_home(isolated_home: Path):
    assert list(isolated_home.iterdir()) == []  # nothing left by another test


def test_child_processes_inherit_the_temporary_cache(isolated_home: Path):
    code = "from topoplan.runner.builtin import builtin_cache_folder as f; print(f('tiny'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert Path(out.strip()).is_relative_to(isolated_home)


def test_reaching_the_real_home_is_caught():
    """The guard sees an access under the real home (here a failed open of a name that cannot exist, which
    changes nothing there) and would fail the test; the record is cleared so this test itself passes."""
    probe = Path(home_guard.REAL_HOME) / f".topoplan-isolation-probe-{uuid.uuid4().hex}"
    before = len(home_guard.touched)
    with pytest.raises(FileNotFoundError):
        open(probe)  # noqa: SIM115
    caught = home_guard.touched[before:]
    del home_guard.touched[before:]
    assert caught == [("open", str(probe))]
    assert not home_guard.in_real_home(sys.executable)  # Python's own files (pyenv lives in the home) pass


def test_no_test_module_copies_the_environment_at_import():
    """A copy of os.environ taken at import holds the real HOME (conftest sets the temporary one per test):
    a child process given it writes into the user's home unseen by the guard. Copy it inside the test.
    Reading one variable at import (`os.environ.get("X")`, `os.environ["X"]`, `"X" in os.environ`) is no copy."""
    import ast

    found = []
    for path in sorted(Path(__file__).parent.glob("*.py")):
        if path.name == "home_guard.py":  # reads the real PYENV_ROOT on purpose: Python's own files
            continue
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
                continue
            reads = {id(n.value) for n in ast.walk(node.value)
                     if (isinstance(n, ast.Attribute) and n.attr == "get") or isinstance(n, ast.Subscript)}
            reads |= {id(c) for n in ast.walk(node.value) if isinstance(n, ast.Compare) for c in n.comparators}
            if any(isinstance(n, ast.Attribute) and n.attr == "environ" and id(n) not in reads
                   for n in ast.walk(node.value)):
                found.append(f"{path.name}:{node.lineno}")
    assert found == []
