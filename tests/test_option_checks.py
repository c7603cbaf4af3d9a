"""Bad options of `run`, `bench`, `calibrate` and `validate` are refused in the parent, before any rank starts:
one `topoplan: error:` line on stderr, exit 2, no traceback, nothing written. In-process and fast: spawning
ranks is replaced by a function that fails the test if it is ever reached."""

from __future__ import annotations

import sys

import pytest

import topoplan.bench.launch
import topoplan.runner.local
from topoplan import cli
from topoplan.runner.options import DTYPE_NAMES


@pytest.fixture
def no_ranks(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a rank was started")

    monkeypatch.setattr(topoplan.runner.local, "spawn_ranks", refuse)
    monkeypatch.setattr(topoplan.bench.launch, "spawn_ranks", refuse)


def topoplan_error(monkeypatch, capsys, *args: str) -> str:
    """Run the CLI in-process; assert the one-line exit-2 contract and return the message."""
    monkeypatch.setattr(sys, "argv", ["topoplan", *args])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err
    assert err.startswith("topoplan: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_run_dtype_names_match_the_ranks():
    import topoplan.runner.dist

    assert DTYPE_NAMES == tuple(topoplan.runner.dist.DTYPES)


@pytest.mark.parametrize("args, message", [
    (["--tp", "2", "--dtype", "int8"], "--dtype 'int8': expected one of float32, bfloat16, float16"),
    (["--backend", "mpi"], "--backend 'mpi': expected nccl or gloo"),
    (["--timeout", "0"], "--timeout 0: expected a positive number of seconds"),
    (["--timeout", "-1"], "--timeout -1: expected a positive"),
    (["--temperature", "-1"], "--temperature -1: expected 0 (greedy) or more"),
    (["--top-p", "0"], "--top-p 0: expected a probability mass in (0, 1]"),
    (["--top-p", "2"], "--top-p 2: expected"),
    (["--seed", "-1"], "--seed -1: expected 0 to 2**64-1"),
])
def test_run_refuses_bad_options_before_any_rank(no_ranks, monkeypatch, capsys, args, message):
    err = topoplan_error(monkeypatch, capsys, "run", "--model", "tiny", "--prompt", "Hi", *args)
    assert message in err
