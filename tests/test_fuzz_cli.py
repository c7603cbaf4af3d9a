"""Fuzz the CLI in-process (issue 17's contract): over damaged pastes, NVML recordings, HF configs,
calibrations and option sets, every run exits 0, or exits 2 with one `topoplan: error:` line — never a
traceback — within the budget stated in docs/limits.md (10 s and 256 MiB of Python allocations per input
here; the deadline is generous for a loaded 2-core CI runner). Spawning is replaced by a stub: an input that
gets past every parent-side check to the point of starting ranks counts as accepted."""

from __future__ import annotations

import sys
import tracemalloc
from datetime import timedelta

import pytest
from fuzz_cases import WouldSpawn, make_case, materialise, no_ranks
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import topoplan.bench.launch
import topoplan.runner.local
from topoplan import cli

MEMORY_BUDGET = 256 * 2**20


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    monkeypatch.setattr(topoplan.runner.local, "spawn_ranks", no_ranks)
    monkeypatch.setattr(topoplan.bench.launch, "spawn_ranks", no_ranks)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def run_case(seed: int, folder, capsys, monkeypatch) -> None:
    case = make_case(seed)
    case_dir = folder / str(seed)
    case_dir.mkdir()
    argv = materialise(case, case_dir)
    monkeypatch.setattr(sys, "argv", ["topoplan", *argv])
    tracemalloc.start()
    try:
        cli.main()
    except SystemExit as exit_:
        code = exit_.code
    except WouldSpawn:  # accepted: ranks would start now
        code = 0
    else:
        code = 0
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    err = capsys.readouterr().err
    assert code in (0, 2), (seed, case.kind, argv[:8], err[-500:])
    if code == 2:
        lines = [line for line in err.splitlines() if not line.startswith("topoplan: warning:")]
        assert len(lines) == 1 and lines[0].startswith("topoplan: error: "), (seed, case.kind, err[-500:])
    assert "Traceback" not in err, (seed, case.kind, err[-800:])
    assert peak < MEMORY_BUDGET, (seed, case.kind, peak)


@settings(max_examples=120, deadline=timedelta(seconds=10), derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_every_input_exits_0_or_2_with_one_line(seed, tmp_path_factory, capsys, monkeypatch):
    run_case(seed, tmp_path_factory.mktemp("fuzz"), capsys, monkeypatch)
