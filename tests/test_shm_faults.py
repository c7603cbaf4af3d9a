"""A rank killed while the shared-memory segment is being set up: nothing is left in /dev/shm and the job's exit
code names the killed rank (128 + 9 for SIGKILL), whichever rank dies at whichever point of the set-up, and
whichever rank the spawner happens to reap first. The kill is injected by tests/shm_kill/sitecustomize.py
(the rank SIGKILLs itself just before opening, or just after mapping, the segment)."""

import os
import sys
from pathlib import Path

import pytest

from topoplan.runner.shm_names import PREFIX, SHM_DIR, new_segment_name, remove_job_segments
from topoplan.runner.spawn import signal_note, spawn_ranks

ROOT = Path(__file__).resolve().parents[1]
HOOK = ROOT / "tests" / "shm_kill"
# (rank killed, point): rank 1 before it opens (rank 0 waits at the barrier with the segment created), rank 1
# with the segment mapped, rank 0 with it created and mapped but not yet unlinked (only the spawner can
# remove it), rank 0 before it creates anything
KILLS = [("1", "open"), ("1", "mapped"), ("0", "mapped"), ("0", "open")]
REPEATS = 20


def kill_env(tmp_path: Path, rank: str, point: str) -> dict[str, str]:
    return {"PYTHONPATH": f"{HOOK}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1",
            "TOPOPLAN_TEST_KILL": f"{rank}:{point}", "TOPOPLAN_TEST_KILL_LOG": str(tmp_path / "killed.log")}


def leftovers(tag: str) -> list[str]:
    return [name for name in os.listdir(SHM_DIR) if name.startswith(f"{PREFIX}{tag}-")]


@pytest.mark.skipif(not os.path.isdir(SHM_DIR), reason="no /dev/shm on this system")
def test_kill_race_at_set_up_leaves_nothing_and_exits_137(tmp_path):
    codes, notes = [], []
    for attempt in range(REPEATS):
        rank, point = KILLS[attempt % len(KILLS)]
        out = tmp_path / str(attempt)
        out.mkdir()
        env = kill_env(out, rank, point)
        result = spawn_ranks(2, [sys.executable, str(ROOT / "tests" / "shm_harness.py"), str(out)],
                             env_per_rank=lambda r, env=env: env, timeout_s=120, grace_s=5, capture_stdout=True,
                             echo=False)
        codes.append(result.returncode)
        notes.append(signal_note(result))
        # the rank died where it was meant to, on a segment named with this spawn's job tag ...
        (path,) = (out / "killed.log").read_text().splitlines()
        tag = Path(path).name.removeprefix(PREFIX).split("-")[0]
        assert len(tag) == 32, path
        # ... and neither that segment nor any other of the job is left
        assert not os.path.exists(path) and leftovers(tag) == [], (rank, point, result.stderr[-5:])
    assert codes == [137] * REPEATS
    assert notes == [f"rank {KILLS[a % len(KILLS)][0]} was killed by SIGKILL" for a in range(REPEATS)]


def test_topoplan_run_names_the_rank_killed_at_set_up(tmp_path):
    """The whole command: `topoplan run --tp 2` with rank 1 killed as it maps the segment exits 137 with one
    line naming rank 1, and leaves nothing in /dev/shm."""
    import subprocess

    env = {**os.environ, **kill_env(tmp_path, "1", "mapped")}
    proc = subprocess.run([sys.executable, "-m", "topoplan", "run", "--model", "tiny", "--tp", "2",
                           "--max-new-tokens", "1", "--prompt", "hi", "--timeout", "30"], env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 137, proc.stderr
    assert proc.stderr.splitlines()[-1] == "topoplan: error: rank 1 was killed by SIGKILL; the other ranks were ended"
    (path,) = (tmp_path / "killed.log").read_text().splitlines()
    assert not os.path.exists(path)


def test_segment_names_carry_the_job_tag_only_when_it_is_one(tmp_path):
    tag = "0123456789abcdef" * 2
    assert new_segment_name({"TOPOPLAN_SHM_JOB": tag}).startswith(f"topoplan-{tag}-")
    for bad in ("", "../../etc/x", "ABC", tag + "0"):  # not a tag: never part of a path
        name = new_segment_name({"TOPOPLAN_SHM_JOB": bad})
        assert name.startswith("topoplan-") and len(name) == len("topoplan-") + 32 and "/" not in name


@pytest.mark.skipif(not os.path.isdir(SHM_DIR), reason="no /dev/shm on this system")
def test_removing_a_job_touches_only_its_own_segments():
    mine, other = "a" * 32, "b" * 32
    paths = [os.path.join(SHM_DIR, f"{PREFIX}{mine}-1"), os.path.join(SHM_DIR, f"{PREFIX}{other}-1")]
    for path in paths:
        Path(path).write_bytes(b"x")
    try:
        assert remove_job_segments(mine) == [f"{PREFIX}{mine}-1"]
        assert not os.path.exists(paths[0]) and os.path.exists(paths[1])
    finally:
        for path in paths:
            if os.path.exists(path):
                os.unlink(path)
