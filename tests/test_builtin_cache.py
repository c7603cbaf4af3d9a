"""The built-in models' cache: checked against the definition on every use, rebuilt with a one-line notice when
it does not match, and safe to build from several processes at once (the conftest gives each test its own
empty cache)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors import safe_open

from topoplan.runner.builtin import BUILD_RECORD, BUILTIN, builtin_cache_folder, cache_mismatch, definition_digest
from topoplan.runner.tiny import builtin_folder

ROOT = Path(__file__).resolve().parent.parent


def _check_built(folder: Path) -> None:
    """A complete tiny folder: the config as defined, every tensor of the right shape, the record last."""
    assert json.loads((folder / "config.json").read_text()) == BUILTIN["tiny"]
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        shape = list(f.get_slice("model.embed_tokens.weight").get_shape())
    assert shape == [BUILTIN["tiny"]["vocab_size"], BUILTIN["tiny"]["hidden_size"]]
    record = json.loads((folder / BUILD_RECORD).read_text())
    assert record["definition_sha256"] == definition_digest("tiny")
    assert record["weights_bytes"] == (folder / "model.safetensors").stat().st_size
    assert cache_mismatch("tiny", folder) is None


def _leftovers(folder: Path) -> list[str]:
    """Anything in the models folder besides the model and its lock file."""
    return sorted(p.name for p in folder.parent.iterdir() if p.name not in (folder.name, f".{folder.name}.lock"))


def test_first_use_builds_silently_and_the_record_comes_last(capsys):
    folder = builtin_folder("tiny")
    assert folder == builtin_cache_folder("tiny")
    _check_built(folder)
    assert capsys.readouterr().err == ""
    assert _leftovers(folder) == []
    weights_written = (folder / "model.safetensors").stat().st_mtime_ns
    assert builtin_folder("tiny") == folder  # a valid folder is used as it is
    assert (folder / "model.safetensors").stat().st_mtime_ns == weights_written


@pytest.mark.parametrize(("damage", "reason"), [
    (lambda f: (f / "config.json").write_text('{"hidden_size": 64}'), "its config.json changed after it was built"),
    (lambda f: (f / BUILD_RECORD).unlink(), f"it has no readable {BUILD_RECORD}"),
    (lambda f: os.truncate(f / "model.safetensors", 100), "its model.safetensors has 100 bytes"),
    (lambda f: (f / BUILD_RECORD).write_text(json.dumps({"definition_sha256": "0" * 64})),
     "it was built from another definition of tiny"),
    (lambda f: (f / "model.safetensors").unlink(), "model.safetensors is unreadable"),
], ids=["config", "no-record", "truncated", "old-definition", "no-weights"])
def test_a_mismatched_cache_is_rebuilt_with_a_one_line_notice(damage, reason, capsys):
    folder = builtin_folder("tiny")
    capsys.readouterr()
    damage(folder)
    assert reason in cache_mismatch("tiny", folder)
    assert builtin_folder("tiny") == folder
    err = capsys.readouterr().err
    assert err.startswith(f"topoplan: notice: rebuilding the cached built-in model tiny ({folder}): {reason}")
    assert err.count("\n") == 1
    _check_built(folder)
    assert _leftovers(folder) == []


def test_run_rebuilds_a_corrupted_config_and_runs(isolated_home: Path):
    """The issue's case: `run --model tiny` with a mismatched config.json used to fail with a shape error."""
    folder = builtin_folder("tiny")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "intermediate_size": 64}))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "topoplan", "run", "--model", "tiny", "--tp", "2", "--prompt-ids",
                           "1,2,3", "--max-new-tokens", "2", "--json"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    notices = [line for line in done.stderr.splitlines() if "notice: rebuilding" in line]
    assert len(notices) == 1 and "its config.json changed after it was built" in notices[0]  # one rank rebuilt
    assert len(json.loads(done.stdout)["tokens"][0]) == 2
    _check_built(folder)


BUILD = """
import sys, time
from pathlib import Path
from topoplan.runner.tiny import builtin_folder  # torch imported first: the two then start together
Path(sys.argv[2]).touch()
while not Path(sys.argv[1]).exists():
    time.sleep(0.005)
print(builtin_folder("tiny"))
"""


@pytest.mark.parametrize("start", ["empty", "corrupted"])
def test_two_processes_building_at_once_both_succeed(start: str, tmp_path: Path):
    if start == "corrupted":
        (builtin_folder("tiny") / "config.json").write_text("{")
    go = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    ready = [tmp_path / f"ready{i}" for i in range(2)]
    procs = [subprocess.Popen([sys.executable, "-c", BUILD, str(go), str(r)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in ready]
    while not all(r.exists() for r in ready) and all(p.poll() is None for p in procs):
        time.sleep(0.01)
    go.touch()  # both have imported torch and poll for this: they ask for the model at the same moment
    results = [p.communicate(timeout=300) for p in procs]
    folder = builtin_cache_folder("tiny")
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in results]
    assert [out.strip() for out, _ in results] == [str(folder)] * 2
    _check_built(folder)
    assert _leftovers(folder) == []
    notices = sum("notice: rebuilding" in err for _, err in results)
    assert notices == (1 if start == "corrupted" else 0)  # one rebuilt under the lock, the other found it done


def test_a_build_killed_midway_is_cleaned_by_the_next_use(isolated_home: Path):
    """SIGKILL while the weights are being written leaves the hidden build folder (no `finally` runs); the next
    use removes it under the cache's lock and builds the model."""
    killer = ("import os, signal\n"
              "import topoplan.runner.tiny as tiny\n"
              "def dying_save(*args, **kwargs):\n"
              "    os.kill(os.getpid(), signal.SIGKILL)\n"
              "tiny.save_file = dying_save\n"
              "tiny.builtin_folder('tiny')\n")
    done = subprocess.run([sys.executable, "-c", killer], env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == -9, done.stderr
    folder = builtin_cache_folder("tiny")
    left = _leftovers(folder)
    assert len(left) == 1 and left[0].startswith(f".{folder.name}.build."), left  # the kill left its folder
    assert (folder.parent / left[0] / "config.json").is_file()  # written before the weights
    assert builtin_folder("tiny") == folder
    _check_built(folder)
    assert _leftovers(folder) == []


def test_stale_build_folders_beside_a_valid_cache_are_removed():
    """A builder killed after swapping its folder in but before removing the old one (`.stale`): the cache is
    valid, and the next use still removes the leftovers, and only them."""
    folder = builtin_folder("tiny")
    stale = [folder.parent / f".{folder.name}.build.x1y2", folder.parent / f".{folder.name}.build.x1y2.stale"]
    for path in stale:
        path.mkdir()
        (path / "model.safetensors").write_bytes(b"partial")
    unrelated = folder.parent / "small-seed0.build.keep"  # not hidden, not this model's: not ours to remove
    unrelated.mkdir()
    weights_written = (folder / "model.safetensors").stat().st_mtime_ns
    assert builtin_folder("tiny") == folder
    assert _leftovers(folder) == ["small-seed0.build.keep"]
    assert (folder / "model.safetensors").stat().st_mtime_ns == weights_written  # not rebuilt
