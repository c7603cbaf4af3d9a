"""`topoplan inspect` end to end: every fixture in every format, the JSON contract against hand-written
expectations, warnings on the machines where they must (and must not) fire, errors and exit codes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from topoplan.cli import app

ROOT = Path(__file__).resolve().parent.parent
TOPO = ROOT / "fixtures/topo"
FIXTURES = sorted(p for p in TOPO.glob("*.txt") if not p.name.endswith((".p2p.txt", ".measured.txt")))
FORMATS = ["table", "json", "dot", "mermaid", "svg", "png"]
runner = CliRunner()


def fixture(prefix: str) -> Path:
    [path] = [p for p in FIXTURES if p.name.startswith(prefix + "_")]
    return path


def inspect_json(path: Path, *extra: str) -> dict:
    result = runner.invoke(app, ["inspect", "--file", str(path), "--json", *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def warnings_by_code(path: Path) -> dict[str, dict]:
    return {w["code"]: w for w in inspect_json(path)["warnings"]}


def run_cli(*args: str, env: dict | None = None, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "topoplan", *args], cwd=ROOT, capture_output=True, text=True,
                          env=env, input=stdin, check=False)


# --- every fixture, every format ------------------------------------------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name[:2])
def test_every_fixture_renders_in_every_format(path: Path, fmt: str, tmp_path: Path):
    expected = json.loads((TOPO / "expected" / (path.stem + ".json")).read_text())
    gpu_ids = [g["id"] for g in expected["gpus"]]
    out = tmp_path / f"topo.{fmt}"
    args = ["inspect", "--file", str(path), "--format", fmt] + (["-o", str(out)] if fmt in ("svg", "png") else [])
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    if fmt == "table":
        assert all(gpu in result.stdout for gpu in gpu_ids)
        assert "NVLink islands:" in result.stdout
    elif fmt == "json":
        data = json.loads(result.stdout)
        assert [g["id"] for g in data["gpus"]] == gpu_ids
        assert [(n["id"], n["name"]) for n in data["nics"]] == [(n["id"], n["name"]) for n in expected["nics"]]
        assert all(isinstance(l["bandwidth_gbps"], float) and l["bandwidth_gbps"] > 0 for l in data["links"])
        codes = {f"{l['a']}-{l['b']}": l["code"] for l in data["links"] if l["a"].startswith("GPU")}
        assert codes == expected["links"]  # GPU-GPU and GPU-NIC pairs, index order, SOC written as SYS
    elif fmt == "dot":
        assert result.stdout.startswith("graph topology {")
        assert all(f'"{gpu}" [label=' in result.stdout for gpu in gpu_ids)
    elif fmt == "mermaid":
        assert result.stdout.startswith("flowchart LR\n")
        assert all(f'{gpu}["{gpu}' in result.stdout for gpu in gpu_ids)
    elif fmt == "svg":
        svg = out.read_text()
        assert "<svg" in svg and all(f">{gpu}</text>" in svg for gpu in gpu_ids)
    else:
        assert out.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


# --- the JSON contract, by hand ------------------------------------------------------------------
def test_json_dgx_a100():
    data = inspect_json(fixture("00"))
    gpu0 = data["gpus"][0]
    assert gpu0["id"] == "GPU0" and gpu0["index"] == 0
    assert gpu0["cpus"] == [*range(48, 64), *range(176, 192)]
    assert (gpu0["numa_node"], gpu0["gpu_numa_id"]) == (3, None)
    assert [g["numa_node"] for g in data["gpus"]] == [3, 3, 1, 1, 7, 7, 5, 5]
    assert [g["nearest_nics"] for g in data["gpus"]] == [["NIC0", "NIC1"]] * 2 + [["NIC2", "NIC3"]] * 2 + \
        [["NIC4", "NIC5"]] * 2 + [["NIC6", "NIC7"]] * 2  # all PXB; NIC8/NIC9 are SYS to every GPU
    assert data["nics"][9] == {"id": "NIC9", "index": 9, "name": "mlx5_9", "pci_bus_id": None, "numa_node": None,
                               "nearest_gpus": [f"GPU{i}" for i in range(8)]}
    assert data["nvlink_islands"] == [[f"GPU{i}" for i in range(8)]]
    assert data["links"][0] == {"a": "GPU0", "b": "GPU1", "code": "NV12", "kind": "nvlink", "nvlinks": 12,
                                "bandwidth_gbps": 240.0, "latency_us": 0.6, "p2p": None,
                                "evidence": None}  # 12 x NCCL's 20 GB/s; a topo -m cell quotes nothing more
    sys_link = next(l for l in data["links"] if (l["a"], l["b"]) == ("GPU0", "NIC2"))
    assert (sys_link["code"], sys_link["kind"], sys_link["nvlinks"], sys_link["bandwidth_gbps"]) == (
        "SYS", "sys", 0, 10.0)
    assert len(data["links"]) == 28 + 8 * 10  # no NIC rows were published, so no NIC-NIC pairs
    assert data["warnings"] == []
    # a paste names no GPU: the generation is inferred from NV12 on every pair of 8 (A100 SXM), and said so
    assert (data["arch"], data["gpu_name"]) == ("sm80", None)
    assert any(n.startswith("GPU generation inferred from the link pattern (NV12, full-mesh, 8 GPUs)")
               for n in data["notes"])
    assert len(data["notes"]) >= 2  # the parser says what it recovered (the header lost its corner cell)


def test_json_old_driver_soc_and_smt_cpu_list():
    data = inspect_json(fixture("20"))
    assert {l["code"] for l in data["links"]} <= {"NV2", "SYS", "PIX", "PXB", "PHB", "NODE"}
    assert data["gpus"][0]["cpus"] == list(range(0, 80, 8))  # "0-0,8-8,...,72-72"
    assert data["gpus"][0]["numa_node"] is None
    assert data["nvlink_islands"] == [["GPU0", "GPU1"], ["GPU2", "GPU3"]]


def test_json_p2p_statuses_attached():
    data = inspect_json(fixture("14"), "--p2p", str(TOPO / "14_rtx3090-2gpu-nv4-lxc-cpuset.p2p.txt"))
    [link] = data["links"]
    assert link["code"] == "NV4" and set(link["p2p"].values()) == {"OK"}
    assert "p2p-not-ok" not in {w["code"] for w in data["warnings"]}


# --- pictures of real machines -------------------------------------------------------------------
def _dot(prefix: str) -> str:
    result = runner.invoke(app, ["inspect", "--file", str(fixture(prefix)), "--format", "dot"])
    assert result.exit_code == 0, result.output
    return result.stdout


def test_dot_nvswitch_box_draws_one_hub_and_nics_beside_their_gpus():
    dot = _dot("00")  # DGX A100: NV12 between every pair, NICs in pairs on PCIe switches
    assert '"NVL0" [label="NVLink all-to-all\\nNV12 240 GB/s per pair", shape=hexagon' in dot
    assert sum(f'"GPU{i}" -- "NVL0" [color="#76b900", penwidth=7];' in dot for i in range(8)) == 8
    assert '"GPU0" -- "GPU1"' not in dot  # no 28-edge clique
    # PCIe Gen4 (24 GB/s): the generation is inferred from the NV12 mesh (A100 SXM class)
    assert '"GPU0" -- "NIC0" [label="PXB 24 GB/s"' in dot and '"GPU0" -- "NIC2"' not in dot
    assert 'subgraph cluster_numa3 {' in dot and 'label="NUMA node 3\\nCPUs 48-63,176-191"' in dot
    assert dot.count(" -- ") == 8 + 8 * 2  # hub edges, each NIC0-7 to its two GPUs; NIC8/NIC9 are SYS to all
    assert '"NIC8" [label="NIC8\\nmlx5_8\\nSYS to every GPU"' in dot


def test_dot_bridged_pairs_are_plain_edges():
    dot = _dot("17")  # H100 NVL: NV12 pairs; NODE inside a socket is not drawn once NVLink is there
    assert [line.split(" [")[0].strip() for line in dot.splitlines() if '" -- "GPU' in line] == [
        '"GPU0" -- "GPU1"', '"GPU2" -- "GPU3"', '"GPU4" -- "GPU5"', '"GPU6" -- "GPU7"']
    assert "NVL0" not in dot


# --- warnings on real machines --------------------------------------------------------------------
def test_warning_p2p_not_ok_from_a_p2p_file(tmp_path: Path):
    topo = tmp_path / "topo.txt"
    topo.write_text("\tGPU0\tGPU1\tGPU2\tCPU Affinity\tNUMA Affinity\n"
                    "GPU0\t X \tPIX\tSYS\t0-7\t0\nGPU1\tPIX\t X \tSYS\t0-7\t0\nGPU2\tSYS\tSYS\t X \t8-15\t1\n")
    p2p = tmp_path / "p2p.txt"
    p2p.write_text("nvidia-smi topo -p2p r\n \tGPU0\tGPU1\tGPU2\n GPU0\tX\tOK\tCNS\n GPU1\tOK\tX\tOK\n"
                   " GPU2\tCNS\tOK\tX\n")
    data = inspect_json(topo, "--p2p", str(p2p))
    assert [w["code"] for w in data["warnings"]] == ["p2p-not-ok"]
    assert data["warnings"][0]["message"].endswith("GPU0-GPU2: read CNS (chipset not supported)")
    assert data["warnings"][0]["devices"] == ["GPU0", "GPU2"]


def test_warning_single_nic_across_sys():
    warning = warnings_by_code(fixture("22"))["nic-across-sys"]
    assert warning["devices"] == [f"GPU{i}" for i in range(8)]  # L40S: the one NIC is SYS to every GPU
    assert warning["advice"]


def test_warning_memory_only_numa_node_gh200():
    warnings = warnings_by_code(fixture("23"))
    assert set(warnings) == {"gpu-memory-numa-node"}
    assert warnings["gpu-memory-numa-node"]["devices"] == ["GPU0"]
    assert "GPU0 memory = NUMA node 1" in warnings["gpu-memory-numa-node"]["message"]


def test_warning_partial_mesh_dgx1():
    warning = warnings_by_code(fixture("07"))["nvlink-partial-mesh"]
    assert warning["devices"] == [f"GPU{i}" for i in range(8)]
    assert "all-to-all groups: GPU0, GPU1, GPU2, GPU3; GPU4, GPU5, GPU6, GPU7" in warning["message"]


def test_warning_islands_of_two_h100_nvl():
    warnings = warnings_by_code(fixture("17"))
    assert warnings["nvlink-split"]["message"] == \
        "NVLink joins only islands of 2 GPUs: GPU0, GPU1; GPU2, GPU3; GPU4, GPU5; GPU6, GPU7"
    assert "nvlink-partial-mesh" not in warnings and "nvlink-unequal-islands" not in warnings
    assert warnings["nic-across-sys"]["devices"] == ["GPU4", "GPU5", "GPU6", "GPU7"]


@pytest.mark.parametrize("prefix", ["11", "00", "26"])
def test_no_warnings_on_healthy_machines(prefix: str):
    assert warnings_by_code(fixture(prefix)) == {}  # 11: all PIX, no NVLink; 00/26: full NV12 mesh, NIC per pair


# --- output files, stdin, errors ------------------------------------------------------------------
def test_table_to_file_is_plain_text(tmp_path: Path):
    out = tmp_path / "topo.txt"
    result = runner.invoke(app, ["inspect", "--file", str(fixture("17")), "-o", str(out)])
    assert result.exit_code == 0 and result.stdout == ""
    text = out.read_text()
    assert "\x1b[" not in text and "nvlink-split" in text and "0-63,128-191" in text  # CPU list as ranges


def test_table_of_18_nics_fits_a_100_column_terminal():
    result = runner.invoke(app, ["inspect", "--file", str(fixture("26"))], env={"COLUMNS": "100"})
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 100
    assert "…" not in result.stdout  # nothing cropped
    assert any("NIC5" in l and "mlx5_5" in l and "PXB: GPU0, GPU1  SYS: GPU2, GPU3, GPU4" in l for l in lines)
    assert any("NIC13" in l and "SYS: GPU0, GPU1, GPU2, GPU3, GPU4, GPU5, GPU6, GPU7" in l for l in lines)


def test_stdin_and_json_alias():
    result = runner.invoke(app, ["inspect", "--file", "-", "--json"],
                           input=fixture("11").read_text())
    assert result.exit_code == 0
    assert json.loads(result.stdout)["links"][0]["code"] == "PIX"


def test_image_needs_output_file():
    result = run_cli("inspect", "--file", str(fixture("11")), "--format", "png")
    assert result.returncode == 2
    assert result.stderr == "topoplan: error: --format png writes a picture: give the file with -o FILE\n"


def test_subprocess_json_and_bad_file(tmp_path: Path):
    ok = run_cli("inspect", "--file", str(fixture("00")), "--json")
    assert ok.returncode == 0 and ok.stderr == ""
    assert json.loads(ok.stdout)["gpus"][2]["cpus"][:2] == [16, 17]
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"")
    out = tmp_path / "out.json"
    failed = run_cli("inspect", "--file", str(bad), "--json", "-o", str(out))
    assert failed.returncode == 2 and failed.stdout == ""
    assert failed.stderr.startswith(f"topoplan: error: {bad}:1: ") and failed.stderr.count("\n") == 1
    assert not out.exists()


def test_usage_errors_are_one_line_exit_2():
    for args in (["inspect", "--bogus"], ["inspect", "--format", "pdf"], ["frobnicate"]):
        result = run_cli(*args)
        assert result.returncode == 2, args
        assert result.stderr.startswith("topoplan: error: ") and result.stderr.count("\n") == 1, result.stderr
        assert "Traceback" not in result.stderr


def _path_without(*programs: str, tmp_path: Path) -> str:
    """A PATH of symlinks to the tools this test needs, minus `programs`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for tool in ("dot", "nvidia-smi"):
        found = shutil.which(tool)
        if found and tool not in programs:
            (bin_dir / tool).symlink_to(found)
    return str(bin_dir)


def test_svg_and_png_need_no_graphviz(tmp_path: Path):
    """The pictures are drawn by topoplan itself: with no program at all on PATH they are still written."""
    env = {**os.environ, "PATH": _path_without("dot", "nvidia-smi", tmp_path=tmp_path)}
    for fmt in ("svg", "png"):
        out = tmp_path / f"topo.{fmt}"
        result = run_cli("inspect", "--file", str(fixture("11")), "--format", fmt, "-o", str(out), env=env)
        assert (result.returncode, result.stderr) == (0, ""), result.stderr
        assert out.read_bytes().startswith(b"<svg" if fmt == "svg" else b"\x89PNG\r\n\x1a\n")
    assert sorted(p.name for p in tmp_path.glob("topo.*")) == ["topo.png", "topo.svg"]
    assert list(tmp_path.glob("*.tmp")) == []


def _fake_nvidia_smi(tmp_path: Path, script: str) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "nvidia-smi"
    fake.write_text("#!/bin/sh\n" + script)
    fake.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin"}


def test_live_source_runs_nvidia_smi_topo_m(tmp_path: Path):
    env = _fake_nvidia_smi(tmp_path, f'[ "$*" = "topo -m" ] || exit 9\ncat "{fixture("30")}"\n')
    result = run_cli("inspect", "--source", "smi", "--json", env=env)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["source"] == "nvidia-smi topo -m"
    assert data["nvlink_islands"] == [["GPU0", "GPU1", "GPU2", "GPU3"]]


def test_live_source_failing_or_missing_suggests_topo(tmp_path: Path):
    env = _fake_nvidia_smi(tmp_path, "echo 'NVIDIA-SMI has failed because it couldn''t communicate with the NVIDIA "
                                     "driver.' >&2\nexit 9\n")
    failed = run_cli("inspect", "--source", "smi", env=env)
    assert failed.returncode == 2 and failed.stderr.count("\n") == 1
    assert "`nvidia-smi topo -m` failed (exit 9): NVIDIA-SMI has failed" in failed.stderr
    assert "--topo topo.txt" in failed.stderr  # the name every topology-reading command takes (--file too)
    missing = run_cli("inspect", "--source", "smi",
                      env={**os.environ, "PATH": _path_without("nvidia-smi", tmp_path=tmp_path / "x")})
    assert missing.returncode == 2
    assert missing.stderr.startswith("topoplan: error: nvidia-smi is not installed") and "--topo" in missing.stderr


def test_cli_does_not_import_torch_or_pynvml():
    code = (f"import sys; from topoplan.cli import main; sys.argv = ['topoplan', 'inspect', '--file', "
            f"{str(fixture('00'))!r}, '--json'];"
            "\ntry: main()\nexcept SystemExit: pass\n"
            "assert not {'torch', 'pynvml'} & set(sys.modules), 'heavy import'")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_json_and_another_format_conflict():
    done = run_cli("inspect", "--file", str(fixture("11")), "--json", "--format", "mermaid")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == "topoplan: error: --json and --format mermaid ask for two formats: pass one"
    assert inspect_json(fixture("11"), "--format", "json")["gpus"][0]["id"] == "GPU0"  # the same format twice is fine


def test_table_headline_counts_in_singular_and_plural():
    result = runner.invoke(app, ["inspect", "--file", str(fixture("23"))])
    assert result.exit_code == 0 and "1 GPU, 4 NICs" in result.stdout
    result = runner.invoke(app, ["inspect", "--file", str(fixture("11"))])
    assert "4 GPUs, 0 NICs" in result.stdout
