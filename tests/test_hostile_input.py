"""Regression tests for the reliability sweep (issue 17): each input that once gave a traceback, was accepted
as nonsense, or cost unbounded time or memory, now gets one `topoplan: error:` line and exit 2 (or a right
answer), in-process and fast."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
from hostile_inputs import BAD_CONFIGS, DGX, HUGE, LLAMA, paste_with

from topoplan import cli
from topoplan.atomic import write_atomic
from topoplan.errors import TopoplanError
from topoplan.limits import MAX_GPUS_PER_NODE, MAX_NODES, read_capped


def outcome(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """Run the CLI in-process: (exit code, stdout, stderr); an exception other than SystemExit fails the test."""
    monkeypatch.setattr(sys, "argv", ["topoplan", *args])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    captured = capsys.readouterr()
    return exit_.value.code, captured.out, captured.err


def refused(monkeypatch, capsys, *args: str) -> str:
    code, _, err = outcome(monkeypatch, capsys, *args)
    assert code == 2, err
    assert err.startswith("topoplan: error: ") and err.count("\n") == 1 and len(err) < 600, err
    return err


@pytest.mark.parametrize("old,new,expected", [
    ("NV12", "NV" + HUGE, "unknown link code"),
    ("\t3\n", "\t" + "3" * 5000 + "\n", "expected a NUMA node number"),
], ids=["link-code", "numa-node"])
def test_huge_integers_in_a_paste(monkeypatch, capsys, tmp_path, old, new, expected):
    paste = tmp_path / "topo.txt"
    paste.write_text(paste_with(old, new))
    assert expected in refused(monkeypatch, capsys, "inspect", "--file", str(paste))


def test_huge_nic_number_in_the_legend_is_not_a_legend_line(monkeypatch, capsys, tmp_path):
    paste = tmp_path / "topo.txt"
    paste.write_text(DGX.read_text() + f"\nNIC Legend:\n\n  NIC{HUGE}: mlx5_0\n")
    code, out, err = outcome(monkeypatch, capsys, "inspect", "--file", str(paste), "--json")
    assert code == 0, err
    assert [nic["name"] for nic in json.loads(out)["nics"]][:2] == ["mlx5_0", "mlx5_1"]


@pytest.mark.parametrize("text,expected", [
    ("[" * 100_000, "nested deeper than 64 levels"),
    ('{"a": ' + HUGE + "}", "JSON integer with 5000 digits"),
    ('{"a": NaN}', "NaN is not JSON"),
    ('{"a": 1e308, "b": 1e400}', "1e400 overflows a float"),
], ids=["deep", "long-int", "nan", "overflow"])
def test_json_that_python_would_crash_on_or_print_as_invalid_json(monkeypatch, capsys, tmp_path, text, expected):
    bad = tmp_path / "calibration.json"
    bad.write_text(text)
    err = refused(monkeypatch, capsys, "plan", "--model", "70b", "--topo", str(DGX), "--gpu", "a100-80gb",
                  "--calibration", str(bad))
    assert expected in err and str(bad) in err


@pytest.mark.parametrize("what,text", BAD_CONFIGS, ids=[c[0] for c in BAD_CONFIGS])
def test_wrong_typed_hf_configs_are_refused_by_name_in_plan_and_run(monkeypatch, capsys, tmp_path, what, text):
    (tmp_path / "config.json").write_text(text)
    planned = refused(monkeypatch, capsys, "plan", "--model", str(tmp_path), "--topo", str(DGX), "--gpu", "a100-80gb")
    ran = refused(monkeypatch, capsys, "run", "--model", str(tmp_path), "--prompt-ids", "1,2")
    assert "config.json" in planned and "config.json" in ran


def test_config_errors_name_the_key_and_the_expected_kind(monkeypatch, capsys, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, "head_dim": -16}))
    err = refused(monkeypatch, capsys, "plan", "--model", str(tmp_path), "--topo", str(DGX), "--gpu", "a100-80gb")
    assert "key 'head_dim' must be a positive integer, got -16" in err


def test_generation_config_that_is_a_list(monkeypatch, capsys, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    (tmp_path / "generation_config.json").write_text("[]")
    err = refused(monkeypatch, capsys, "run", "--model", str(tmp_path), "--prompt-ids", "1,2")
    assert "generation_config.json" in err and "expected a JSON object" in err


@pytest.mark.parametrize("args,expected", [
    (["bench", "--sizes", "1" + "0" * 5000], "expected a byte count from 1 to 64G"),
    (["bench", "--sizes", ",".join(str(n) for n in range(1, 200))], "at most 64"),
    (["run", "--timeout", "inf", "--prompt-ids", "1"], "at most 86400"),
    (["run", "--timeout", "nan", "--prompt-ids", "1"], "expected a positive number of seconds"),
    (["plan", "--model", "70b", "--topo", str(DGX), "--gpu", "a100-80gb", "--nodes", "100000"],
     f"--nodes must be from 1 to {MAX_NODES}"),
    (["launch", "--layout", "tp=8", "--topo", str(DGX), "--gpu", "a100-80gb", "-o", ""], "an empty output path"),
], ids=["size-digits", "size-count", "timeout-inf", "timeout-nan", "nodes", "empty-output"])
def test_options_beyond_any_real_value(monkeypatch, capsys, args, expected):
    assert expected in refused(monkeypatch, capsys, *args)


def test_run_refuses_more_ranks_than_the_machine_can_hold(monkeypatch, capsys):
    err = refused(monkeypatch, capsys, "run", "--dp", "1000", "--prompt-ids", "1")
    assert "1000 ranks" in err and "8 per CPU" in err


def test_endless_input_is_refused_before_reading(monkeypatch, capsys):
    err = refused(monkeypatch, capsys, "inspect", "--file", "/dev/zero")
    assert "/dev/zero: a character device, not a regular file" in err


def test_read_capped_reads_no_more_than_the_cap(tmp_path):
    big = tmp_path / "big"
    big.write_bytes(b"x" * 101)
    assert read_capped(big, cap=101) == b"x" * 101
    with pytest.raises(TopoplanError, match="larger than"):
        read_capped(big, cap=100)


def test_a_paste_with_more_gpus_than_a_node_holds(monkeypatch, capsys, tmp_path):
    n = MAX_GPUS_PER_NODE + 1
    rows = [f"GPU{i}\t" + "\t".join(" X " if i == j else "NV1" for j in range(n)) + "\t0-7\t0" for i in range(n)]
    paste = tmp_path / "big.txt"
    paste.write_text("\t" + "\t".join(f"GPU{i}" for i in range(n)) + "\tCPU Affinity\tNUMA Affinity\n"
                     + "\n".join(rows) + "\n")
    assert f"at most {MAX_GPUS_PER_NODE} GPUs" in refused(monkeypatch, capsys, "inspect", "--file", str(paste))


def test_clique_listing_and_placement_stay_polynomial(monkeypatch, capsys, tmp_path):
    """32 GPUs with NVLink between all but the pairs inside groups of 3 (complement of triangles: 3^10 maximal
    cliques): inspect and plan finish (generous bound against minutes, not a timing assert of speed)."""
    n = MAX_GPUS_PER_NODE
    rows = [f"GPU{i}\t" + "\t".join(" X " if i == j else ("SYS" if i // 3 == j // 3 else "NV1") for j in range(n))
            + "\t0-7\t0" for i in range(n)]
    paste = tmp_path / "cliques.txt"
    paste.write_text("\t" + "\t".join(f"GPU{i}" for i in range(n)) + "\tCPU Affinity\tNUMA Affinity\n"
                     + "\n".join(rows) + "\n")
    start = time.monotonic()
    code, out, err = outcome(monkeypatch, capsys, "inspect", "--file", str(paste), "--json")
    assert code == 0, err
    assert any(w["code"] == "nvlink-partial-mesh" for w in json.loads(out)["warnings"])
    code, _, err = outcome(monkeypatch, capsys, "plan", "--model", "8b", "--topo", str(paste), "--gpu", "a100-80gb",
                           "--json")
    assert code == 0, err
    assert time.monotonic() - start < 600


def test_recording_values_are_range_checked(monkeypatch, capsys, tmp_path):
    from hostile_inputs import RECORDINGS

    recording = json.loads(RECORDINGS[0].read_text())
    recording["nvml"]["gpus"][0]["index"] = -1
    bad = tmp_path / "rec.json"
    bad.write_text(json.dumps(recording))
    assert "expected 0..31, found -1" in refused(monkeypatch, capsys, "inspect", "--file", str(bad))
    recording = json.loads(RECORDINGS[0].read_text())
    place = next(iter(recording["sysfs"]["pci"].values()))
    place["numa_node"] = -5
    bad.write_text(json.dumps(recording))
    assert "expected -1..1023, found -5" in refused(monkeypatch, capsys, "inspect", "--file", str(bad))


# --- output files -----------------------------------------------------------------------------------------

def test_character_devices_are_written_through_not_replaced():
    with pytest.raises(TopoplanError, match="No space left on device"):
        write_atomic("/dev/full", "x")
    assert Path("/dev/full").is_char_device()
    write_atomic("/dev/null", "x")
    assert Path("/dev/null").is_char_device()


def test_a_fifo_is_written_through(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        write_atomic(fifo, "hello")
        assert os.read(reader, 100) == b"hello"
    finally:
        os.close(reader)
    assert fifo.is_fifo()


def test_a_symlink_is_followed_and_kept(tmp_path):
    target = tmp_path / "real.sh"
    target.write_text("old")
    link = tmp_path / "link.sh"
    link.symlink_to(target)
    write_atomic(link, "new")
    assert link.is_symlink() and target.read_text() == "new"


def test_the_runner_command_keeps_a_dash_value_a_value():
    from topoplan.launch.command import runner_command
    from topoplan.layout import Layout
    from topoplan.run_options import parse_argv

    argv = runner_command(Layout(tp=2), None, checkpoint="-rf", prompt_ids=["1,2"])
    parsed = parse_argv(argv[argv.index("topoplan.runner") + 1:])
    assert parsed.model == "-rf" and parsed.tp == 2
