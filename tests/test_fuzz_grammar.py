"""Fuzz by grammar in CI (issue 37): for every input format, a bounded sample of structurally valid but extreme
inputs (tests/grammar_cases.py) keeps docs/limits.md's contract -- exit 0, or exit 2 with one `topoplan: error:`
line; within 10 s and 256 MiB of Python allocations; no ESC or BEL from the input on the terminal.
benchmarks/fuzz_sweep.py --grammar runs the same strategies at larger counts and prints figures per class."""

from __future__ import annotations

import pytest
from fuzz_cases import broken, materialise, no_ranks, run_within_budget
from grammar_cases import FORMATS
from hypothesis import HealthCheck, given, settings

import topoplan.bench.launch
import topoplan.runner.local

SAMPLE = 8  # inputs per format in CI: 56 in all, about a minute on the 2-core VM


@pytest.fixture(autouse=True)
def _no_ranks(monkeypatch):
    monkeypatch.setattr(topoplan.runner.local, "spawn_ranks", no_ranks)
    monkeypatch.setattr(topoplan.bench.launch, "spawn_ranks", no_ranks)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_extreme_shapes_keep_the_contract(fmt, tmp_path_factory):
    @settings(max_examples=SAMPLE, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=FORMATS[fmt])
    def check(case):
        folder = tmp_path_factory.mktemp("grammar")
        outcome = run_within_budget(materialise(case, folder))
        assert not broken(outcome), (case.kind, broken(outcome), outcome.err[-600:], outcome.traceback)

    check()
