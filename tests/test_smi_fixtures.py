"""Every real `nvidia-smi topo -m` paste in fixtures/topo/ against its hand-written expectation.

The expectations are fixtures/topo/expected/*.json (written and checked by people, see its README);
nothing here is derived from the parser. A key missing from a GPU object means the value is unknown,
so it is not asserted.
"""

import json
from pathlib import Path

import pytest

from topoplan.topology.read import read_topology
from topoplan.topology.smi_text import parse_topo_text

TOPO = Path(__file__).resolve().parent.parent / "fixtures" / "topo"
EXPECTED = sorted((TOPO / "expected").glob("*.json"))


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def test_all_seventeen_fixtures_have_expectations():
    assert len(EXPECTED) == 17
    matrices = [p for p in TOPO.glob("*.txt") if ".p2p" not in p.name and ".measured" not in p.name]
    assert sorted(p.name for p in matrices) == sorted(_load(p)["file"] for p in EXPECTED)


@pytest.mark.parametrize("expected_path", EXPECTED, ids=lambda p: p.stem[:2])
def test_fixture_matches_expectation(expected_path):
    expected = _load(expected_path)
    topo = read_topology(str(TOPO / expected["file"]))

    assert [g.id for g in topo.gpus] == [g["id"] for g in expected["gpus"]]
    for gpu, want in zip(topo.gpus, expected["gpus"]):
        if "cpus" in want:
            assert gpu.cpus == (tuple(want["cpus"]) if want["cpus"] is not None else None), gpu.id
        if "numa_node" in want:
            assert gpu.numa_node == want["numa_node"], gpu.id
        if "gpu_numa_id" in want:
            assert gpu.gpu_numa_id == want["gpu_numa_id"], gpu.id

    assert [(n.id, n.name) for n in topo.nics] == [(n["id"], n["name"]) for n in expected["nics"]]

    got = {f"{l.a}-{l.b}": l.code for l in topo.links() if l.a.startswith("GPU") or l.b.startswith("GPU")}
    want = {}
    for pair, code in expected["links"].items():  # the JSON lists GPU first; the model sorts ids
        a, b = pair.split("-")
        want["-".join(sorted((a, b)))] = code
    assert got == want

    # Clean pastes need no recovery; a mangled one must say what was recovered.
    if expected["status"] == "clean":
        assert topo.notes == ()
    else:
        assert topo.notes


# --- tricky cells, quoted from the fixture text ------------------------------------------------------
def _fixture(prefix: str):
    (path,) = [p for p in TOPO.glob(f"{prefix}_*.txt") if ".p2p" not in p.name and ".measured" not in p.name]
    return parse_topo_text(path.read_text(), path.name)


def test_overflow_cell_112_127_7():
    # fixture 04: "GPU4    ...    SYS     112-127 7"
    topo = _fixture("04")
    assert topo.gpu("GPU4").cpus == tuple(range(112, 128))
    assert topo.gpu("GPU4").numa_node == 7


def test_na_two_tab_stops_after_cpu_is_numa():
    # fixture 24: "GPU0     X      PIX     PIX     0-23            N/A" under "CPU Affinity    NUMA Affinity"
    gpu = _fixture("24").gpu(0)
    assert gpu.cpus == tuple(range(24)) and gpu.numa_node is None and gpu.gpu_numa_id is None


def test_gh200_gpu_numa_id_differs_from_numa_affinity():
    # fixture 23: "GPU0     X      NODE    NODE    NODE    NODE    0-71    0               1"
    gpu = _fixture("23").gpu(0)
    assert (gpu.numa_node, gpu.gpu_numa_id) == (0, 1)


def test_smt8_singleton_ranges_and_soc():
    # fixture 20: "GPU2    SOC     SOC      X      NV2 ... 80-80,88-88,96-96,...,152-152"
    topo = _fixture("20")
    assert topo.gpu(2).cpus == tuple(range(80, 153, 8))
    assert topo.link("GPU0", "GPU2").code == "SYS"
    assert [n.name for n in topo.nics] == ["mlx5_0", "mlx5_1"]


def test_repadded_trailing_columns_fixture_17():
    # fixture 17: "64-127,192-255   1               N/A" (the NUMA value is not on a tab stop)
    gpu = _fixture("17").gpu(4)
    assert gpu.cpus == tuple(range(64, 128)) + tuple(range(192, 256))
    assert (gpu.numa_node, gpu.gpu_numa_id) == (1, None)


def test_ansi_leftovers_and_nic_legend_fixture_01():
    # fixture 01: header "\t[4mGPU0\t...\tGPU NUMA ID[0m"; legend "NIC8: mlx5_bond_0"
    topo = _fixture("01")
    assert topo.nics[8].name == "mlx5_bond_0"
    assert topo.gpu(7).gpu_numa_id is None and topo.gpu(7).numa_node == 1
    assert topo.link("NIC0", "NIC1").code == "NODE"  # NIC-NIC links come from the NIC rows


def test_gpu_rows_only_fixture_00_says_so():
    topo = _fixture("00")
    assert any("lost its empty corner cell" in n for n in topo.notes)
    assert any("no NIC rows" in n for n in topo.notes)
    assert topo.link("GPU0", "NIC1").code == "PXB"
    with pytest.raises(Exception):
        topo.link("NIC0", "NIC1")  # never printed, so unknown


def test_rst_indent_fixture_30():
    topo = _fixture("30")
    assert [n.name for n in topo.nics] == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert topo.nvlink_islands() == [["GPU0", "GPU1", "GPU2", "GPU3"]]


@pytest.mark.parametrize("expected_path", EXPECTED, ids=lambda p: p.stem[:2])
def test_same_result_with_tabs_expanded(expected_path):
    """A terminal copy of a tab-separated paste (tabs expanded to 8-column stops) reads the same."""
    text = (TOPO / _load(expected_path)["file"]).read_text()
    a, b = parse_topo_text(text), parse_topo_text(text.expandtabs(8))
    assert a.gpus == b.gpus and a.nics == b.nics and a.links() == b.links()
