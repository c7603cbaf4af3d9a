"""The local rank spawner: environment per rank, output relay, failure propagation, timeout, and retry when
the rendezvous port was taken."""

from __future__ import annotations

import json
import socket
import sys
import time
from pathlib import Path

import topoplan.runner.spawn as spawn
from topoplan.runner.spawn import spawn_ranks

ROOT = Path(__file__).resolve().parents[1]


def py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_each_rank_gets_its_env_and_rank0_stdout_is_relayed():
    code = ("import os, json; print(json.dumps({k: os.environ[k] for k in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', "
            "'MASTER_ADDR', 'MASTER_PORT', 'EXTRA')}))")
    result = spawn_ranks(3, py(code), env_per_rank=lambda r: {"EXTRA": f"x{r}"}, capture_stdout=True, echo=False)
    assert result.returncode == 0 and result.failed_rank is None
    env = json.loads(result.stdout)
    assert env["RANK"] == "0" and env["WORLD_SIZE"] == "3" and env["EXTRA"] == "x0"
    assert env["MASTER_ADDR"] == "127.0.0.1" and int(env["MASTER_PORT"]) > 0
    assert any(line.startswith("[rank 2] {") and '"EXTRA": "x2"' in line for line in result.stderr)


def test_one_failure_stops_the_others_after_the_grace_period():
    code = "import os, sys, time; r = int(os.environ['RANK']); sys.exit(3) if r == 1 else time.sleep(60)"
    start = time.monotonic()
    result = spawn_ranks(3, py(code), grace_s=1.0, capture_stdout=True, echo=False)
    assert result.returncode == 3 and result.failed_rank == 1
    assert time.monotonic() - start < 20


def test_timeout_stops_everything_with_code_124():
    result = spawn_ranks(2, py("import time; time.sleep(60)"), timeout_s=1.0, capture_stdout=True, echo=False)
    assert result.returncode == 124


def test_taken_rendezvous_port_is_retried(tmp_path, monkeypatch):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    ports = iter([busy.getsockname()[1], spawn.free_port()])
    monkeypatch.setattr(spawn, "free_port", lambda: next(ports))
    (tmp_path / "jobs.json").write_text("[]")  # join the world, run nothing, leave
    argv = [sys.executable, str(ROOT / "tests" / "runner_harness.py"), str(tmp_path / "jobs.json"), str(tmp_path)]
    result = spawn_ranks(2, argv, env_per_rank=lambda r: {"PYTHONPATH": str(ROOT)}, timeout_s=120, grace_s=2.0,
                         capture_stdout=True, echo=False)
    busy.close()
    assert result.returncode == 0, result.stderr
    assert next(ports, None) is None  # the second port was used


def test_local_ranks_get_their_own_cpus_from_the_start():
    """`topoplan run` and bench pin each rank to its own CPUs (launch's split) with OMP_NUM_THREADS to match;
    the child sees the pinning as soon as it runs."""
    from topoplan.cpuset import cpu_cores
    from topoplan.runner.local import local_ranks

    available = cpu_cores()
    world = min(2, len(available))
    ranks = local_ranks(world, progress=False)
    given = [set(r.cpus) for r in ranks]
    assert all(given) and set().union(*given) <= set(available)
    assert sum(len(g) for g in given) == len(set().union(*given))  # no CPU given twice
    assert [r.env["OMP_NUM_THREADS"] for r in ranks] == [str(len(g)) for g in given]
    code = "import os, json; print(json.dumps(sorted(os.sched_getaffinity(0))), flush=True)"
    result = spawn_ranks(world, py(code), cpus_per_rank=lambda r: ranks[r].cpus, capture_stdout=True, echo=False)
    assert result.returncode == 0
    assert json.loads(result.stdout) == sorted(ranks[0].cpus)
    if world == 2:
        assert any(line == f"[rank 1] {json.dumps(sorted(ranks[1].cpus))}" for line in result.stderr)


def test_local_ranks_spin_briefly_at_barriers_unless_the_user_says_otherwise(monkeypatch):
    """GOMP_SPINCOUNT bounds how long an OpenMP thread spins before it sleeps (a busy host); a user's own
    GOMP_SPINCOUNT or OMP_WAIT_POLICY is inherited by the ranks, not overridden."""
    from topoplan.cpuset import GOMP_SPIN_COUNT
    from topoplan.runner.local import local_ranks

    for name in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY"):
        monkeypatch.delenv(name, raising=False)
    assert all(r.env["GOMP_SPINCOUNT"] == str(GOMP_SPIN_COUNT) for r in local_ranks(2, progress=False))
    for name, value in (("OMP_WAIT_POLICY", "PASSIVE"), ("GOMP_SPINCOUNT", "1000")):
        with monkeypatch.context() as m:
            m.setenv(name, value)
            assert all("GOMP_SPINCOUNT" not in r.env for r in local_ranks(2, progress=False))


def test_more_ranks_than_cpus_are_not_pinned():
    from topoplan.cpuset import cpu_cores
    from topoplan.runner.local import local_ranks

    ranks = local_ranks(len(cpu_cores()) + 1, progress=False)
    assert all(r.cpus is None and r.env["OMP_NUM_THREADS"] == "1" for r in ranks)
