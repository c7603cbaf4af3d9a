"""`plan --gpus`: planning on part of a machine (topology.subset), and the reason a plan gives when it ranks a
TP size that `inspect` advises against."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from topoplan.cli import app
from topoplan.errors import TopoplanError
from topoplan.topology.read import read_topology
from topoplan.topology.subset import gpu_subset, parse_gpus

ROOT = Path(__file__).resolve().parent.parent
H100_NVL = str(ROOT / "fixtures" / "topo" / "17_h100-nvl-8gpu-nv12-pairs-2nic.txt")  # NVLink pairs 0-1, 2-3, ...


def plan(*args: str) -> tuple[dict, str]:
    run = CliRunner().invoke(app, ["plan", "-m", "70b", "--topo", H100_NVL, "--gpu", "h100-nvl", "--json", *args])
    assert run.exit_code == 0, run.output
    return json.loads(run.stdout), run.stderr


def test_parse_gpus_lists_ranges_and_ids():
    topo = read_topology(H100_NVL)
    assert parse_gpus("4,5,6,7", topo) == parse_gpus("4-7", topo) == parse_gpus("GPU4-GPU5,6, 7", topo) == [
        "GPU4", "GPU5", "GPU6", "GPU7"]
    assert parse_gpus("7,0", topo) == ["GPU0", "GPU7"]  # the machine's order


@pytest.mark.parametrize(("text", "message"), [("4,8", "--gpus 8: no such GPU (this machine has GPU0-GPU7)"),
                                               ("5-3", "--gpus 5-3: no such GPU"),
                                               ("1,1", "--gpus names GPU1 twice"),
                                               ("", "expected GPU indexes like 4,5,6,7 or 4-7, got ''"),
                                               ("a", "expected GPU indexes")])
def test_a_bad_gpu_list_is_refused_in_one_line(text, message):
    with pytest.raises(TopoplanError, match=re.escape(message)):
        parse_gpus(text, read_topology(H100_NVL))


def test_the_subset_keeps_ids_links_and_nics():
    whole = read_topology(H100_NVL)
    part = gpu_subset(whole, "4-7")
    assert [g.id for g in part.gpus] == ["GPU4", "GPU5", "GPU6", "GPU7"] and part.nics == whole.nics
    assert part.link("GPU4", "GPU5") == whole.link("GPU4", "GPU5")
    assert part.link("GPU5", "NIC0") == whole.link("GPU5", "NIC0")
    assert "--gpus 4-7: planned on GPU4, GPU5, GPU6, GPU7 of 8 GPUs" in part.notes


def test_plan_on_four_of_eight_gpus():
    """70B on GPUs 4-7 of the H100 NVL box: every layout places on those four, launches with them visible, and
    counts its throughput per GPU of the four."""
    out, _ = plan("--gpus", "4,5,6,7", "--top", "0")
    assert out["topology"]["gpus"] == ["GPU4", "GPU5", "GPU6", "GPU7"] and out["serving"]["machine_gpus"] == 4
    for entry in out["layouts"]:
        assert {p["gpu"] for p in entry["placement"]} <= {"GPU4", "GPU5", "GPU6", "GPU7"}
        assert set(entry["cuda_visible_devices"].split(",")) <= {"4", "5", "6", "7"}
        served = entry["served"]
        assert served["output_tokens_per_s_per_gpu"] == pytest.approx(served["output_tokens_per_s"] / 4, rel=1e-3)
    assert {(e["tp"], e["pp"], e["dp"]) for e in out["layouts"] + out["hidden"]} >= {(4, 1, 1), (2, 1, 2), (2, 2, 1)}


def test_a_layout_against_inspects_advice_says_why_it_ranks():
    """inspect warns nvlink-split (keep TP <= 2) on the NVL pairs; plan ranks TP4 first by request latency and the
    reason after its link finding says so, with the figure of the best layout within TP 2."""
    out, _ = plan("--top", "0")
    first = out["layouts"][0]
    best_tp2 = next(e for e in out["layouts"] if e["tp"] <= 2)
    assert first["tp"] == 4 and first["reasons"][0].startswith("TP4 spans a NODE hop")
    assert first["reasons"][1] == (
        f"TP4 against inspect's nvlink-split advice (TP <= 2): request latency "
        f"{first['served']['request_latency_ms']:.0f} ms here vs {best_tp2['served']['request_latency_ms']:.0f} ms for "
        f"tp={best_tp2['tp']},pp={best_tp2['pp']},dp={best_tp2['dp']}, the best within it")
    assert not any("advice" in reason for reason in best_tp2["reasons"])
