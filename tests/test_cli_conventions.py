"""What users of other command-line tools expect: --version, -h on every command, shell completion, and
`topoplan list gpus|models` (the catalogs with their sources)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

import topoplan
from topoplan.cli import app
from topoplan.hardware import GPUS
from topoplan.models import CATALOG, MODEL_SOURCES

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


# Typer detects the user's shell from the process tree (shellingham); a test run need not have a shell above it
# (CI, a detached job), so the test names the shell, as typer's own tests do.
NAMED_SHELL = {"_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**(env or os.environ), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "topoplan", *args], cwd=ROOT, capture_output=True, text=True,
                          env=env, check=False, timeout=120)


def command_paths(command: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and sub-command of the app (a click or typer-vendored click group), as the words that
    call it."""
    found = [path]
    if hasattr(command, "commands"):
        for name, sub in command.commands.items():
            found += command_paths(sub, (*path, name))
    return found


def test_version_matches_the_package():
    result = run_cli("--version")
    assert (result.returncode, result.stdout, result.stderr) == (0, f"topoplan {topoplan.__version__}\n", "")
    declared = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert topoplan.__version__ == declared
    assert run_cli("-V").stdout == result.stdout


PATHS = command_paths(typer.main.get_command(app))


def test_every_command_is_listed():
    assert {p[0] for p in PATHS if p} >= {"inspect", "plan", "launch", "run", "bench", "calibrate", "validate", "list"}
    assert ("list", "gpus") in PATHS and ("list", "models") in PATHS


@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(p) or "topoplan")
def test_h_is_help_on_every_command(path: tuple[str, ...]):
    short = runner.invoke(app, [*path, "-h"], prog_name="topoplan")
    long = runner.invoke(app, [*path, "--help"], prog_name="topoplan")
    assert short.exit_code == 0 and long.exit_code == 0, short.output
    assert short.stdout == long.stdout
    assert f"Usage: topoplan {' '.join(path)}".rstrip() in short.stdout
    assert any("--help" in line and re.search(r"\s-h\s", line) for line in short.stdout.splitlines())


def test_show_completion_prints_a_bash_script_that_completes(tmp_path: Path):
    result = run_cli("--show-completion", "bash", env={**os.environ, **NAMED_SHELL})
    assert result.returncode == 0, result.stderr
    script = result.stdout
    # the same script without typer's option, as click documents it (for a shell other than the current one)
    assert run_cli(env={**os.environ, "_TOPOPLAN_COMPLETE": "source_bash"}).stdout.strip() == script.strip()
    assert "complete -o default -F _topoplan_completion topoplan" in script
    assert "_TOPOPLAN_COMPLETE=complete_bash" in script
    # Run it in bash against this tree's topoplan: the words it offers are the app's own.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "topoplan").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m topoplan "$@"\n')
    (bin_dir / "topoplan").chmod(0o755)
    (tmp_path / "completion.bash").write_text(script)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}

    def complete(*words: str) -> list[str]:
        line = " ".join(f"'{w}'" for w in ("topoplan", *words))
        bash = (f"source {tmp_path / 'completion.bash'}; COMP_WORDS=({line}); COMP_CWORD={len(words)}; "
                '_topoplan_completion topoplan; printf "%s\\n" "${COMPREPLY[@]}"')
        done = subprocess.run(["bash", "-c", bash], env=env, capture_output=True, text=True, check=True, timeout=120)
        return done.stdout.split()

    assert complete("li") == ["list"]
    assert sorted(complete("list", "")) == ["gpus", "models"]
    assert "--format" in complete("inspect", "--fo")


def test_install_completion_writes_into_the_home(isolated_home: Path):
    assert os.environ["HOME"] == str(isolated_home)  # the environment below is read now, inside the test
    result = run_cli("--install-completion", "bash", env={**os.environ, **NAMED_SHELL})
    assert result.returncode == 0, result.stderr
    assert "_TOPOPLAN_COMPLETE=complete_bash" in next(isolated_home.rglob("topoplan*")).read_text()
    assert "topoplan" in (isolated_home / ".bashrc").read_text()


def test_list_gpus_json_is_the_catalog():
    result = runner.invoke(app, ["list", "gpus", "--json"])
    assert result.exit_code == 0
    rows = json.loads(result.stdout)
    assert rows == [json.loads(json.dumps(asdict(g))) for g in GPUS]
    assert all(row["source"] for row in rows)


def test_list_models_json_has_every_entry_with_its_source():
    result = runner.invoke(app, ["list", "models", "--json"])
    assert result.exit_code == 0
    rows = json.loads(result.stdout)
    assert [r["name"] for r in rows] == list(CATALOG) and set(MODEL_SOURCES) == set(CATALOG)
    llama = next(r for r in rows if r["name"] == "Llama-3.1-70B")
    assert (llama["aliases"], llama["layers"], llama["hidden"], llama["heads"], llama["kv_heads"],
            llama["max_context"]) == (["70b"], 80, 8192, 64, 8, 131072)
    assert round(llama["params"] / 1e9, 1) == 70.6  # Meta's model card: 70.6B
    assert llama["source"] == "config.json of meta-llama/Llama-3.1-70B on the Hugging Face hub"
    assert llama["config"] == CATALOG["Llama-3.1-70B"]


@pytest.mark.parametrize("what", ["gpus", "models"])
def test_list_tables_fit_80_columns_and_name_every_entry_and_source(what: str):
    result = runner.invoke(app, ["list", what], env={"COLUMNS": "80"})
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    names = [g.key for g in GPUS] if what == "gpus" else list(CATALOG)
    first_cells = [line.split()[0] for line in lines if line.strip()]
    assert all(name in first_cells for name in names)
    sources = {g.source for g in GPUS} if what == "gpus" else set(MODEL_SOURCES.values())
    text = " ".join(" ".join(lines).split())  # sources wrap at 80 columns
    assert all(" ".join(source.split()) in text for source in sources)
