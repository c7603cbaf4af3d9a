"""Renderers and the JSON contract on hand-built machines (every fixture goes through the CLI in
test_inspect_cli.py)."""

import json
import shutil
import subprocess

import pytest

from topoplan.atomic import atomic_path, write_atomic
from topoplan.cpuset import compact_cpus
from topoplan.errors import TopoplanError
from topoplan.topology import Gpu, Nic, build_topology
from topoplan.topology.export import dumps, topology_dict
from topoplan.topology.render.dot import render_dot
from topoplan.topology.render.mermaid import render_mermaid
from topoplan.topology.render.picture import picture


def _two_sockets():
    """Two NVLink pairs per socket (NV4), PCIe NODE inside a socket, SYS across; NIC0 on GPU0/1's switch,
    NIC1 a front-end NIC across SYS from everything."""
    gpus = [Gpu(f"GPU{i}", i, cpus=tuple(range(16 * (i // 2), 16 * (i // 2) + 16)), numa_node=i // 2)
            for i in range(4)]
    codes = {("GPU0", "GPU1"): "NV4", ("GPU2", "GPU3"): "NV4"}
    codes |= {(f"GPU{i}", f"GPU{j}"): "SYS" for i in (0, 1) for j in (2, 3)}
    codes |= {("GPU0", "NIC0"): "PIX", ("GPU1", "NIC0"): "PIX", ("GPU2", "NIC0"): "SYS", ("GPU3", "NIC0"): "SYS"}
    codes |= {(f"GPU{i}", "NIC1"): "SYS" for i in range(4)}
    codes[("NIC0", "NIC1")] = "SYS"
    return build_topology(gpus, [Nic("NIC0", 0, "mlx5_0"), Nic("NIC1", 1, 'eth"0')], codes, arch="sm80",
                          source="two-sockets")


def test_compact_cpus():
    assert compact_cpus([176, 48, 49, 50, 177]) == "48-50,176-177"
    assert compact_cpus((4, 6, 9, 15, 17)) == "4,6,9,15,17"
    assert compact_cpus([3]) == "3"
    assert compact_cpus(None) == "-"


def test_picture_draws_only_best_links_and_nics_beside_their_gpus():
    pic = picture(_two_sockets())
    assert [(l.a, l.b, l.code) for l in pic.gpu_links] == [("GPU0", "GPU1", "NV4"), ("GPU2", "GPU3", "NV4")]
    assert sorted((l.a, l.b) for l in pic.nic_links) == [("GPU0", "NIC0"), ("GPU1", "NIC0")]
    assert pic.lone_nics == ["NIC1"]
    assert pic.groups == {0: ["GPU0", "GPU1", "NIC0"], 1: ["GPU2", "GPU3"], None: ["NIC1"]}


def test_picture_keeps_a_gpus_only_links_even_when_far():
    """A GPU alone on its socket (SYS to every other GPU) is still drawn connected."""
    gpus = [Gpu(f"GPU{i}", i) for i in range(3)]
    topo = build_topology(gpus, [], {("GPU0", "GPU1"): "SYS", ("GPU0", "GPU2"): "SYS", ("GPU1", "GPU2"): "NODE"})
    assert [l.code for l in picture(topo).gpu_links] == ["SYS", "SYS", "NODE"]


def test_dot_is_valid_graphviz_with_clusters_and_thick_nvlink():
    dot = render_dot(_two_sockets())
    assert 'subgraph cluster_numa0 {' in dot and 'label="NUMA node 1\\nCPUs 16-31"' in dot
    assert '"GPU0" -- "GPU1" [label="NV4 80 GB/s", color="#76b900", penwidth=3];' in dot
    assert '"NIC1" [label="NIC1\\neth\\"0\\nSYS to every GPU"' in dot  # quoted name, no edges
    assert '"NIC1" --' not in dot and '-- "NIC1"' not in dot
    if shutil.which("dot"):
        done = subprocess.run(["dot", "-Tsvg"], input=dot, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
        assert done.stdout.count('class="node"') == 6


def test_mermaid_lists_subgraphs_edges_and_styles():
    text = render_mermaid(_two_sockets())
    lines = text.splitlines()
    assert lines[0] == "flowchart LR"
    assert '  subgraph numa0["NUMA node 0 · CPUs 0-15"]' in lines
    assert '  GPU0 ===|"NV4 80 GB/s"| GPU1' in lines
    assert '  GPU0 -.-|"PIX 24 GB/s"| NIC0' in lines
    assert '  NIC1(["NIC1 eth#quot;0 (SYS to every GPU)"]):::nic' in lines
    assert sum(l.startswith("  linkStyle") for l in lines) == 4


def test_json_contract():
    data = json.loads(json.dumps(topology_dict(_two_sockets())))
    gpu0 = data["gpus"][0]
    assert {k: gpu0[k] for k in ("id", "index", "numa_node", "gpu_numa_id", "nearest_nics")} == {
        "id": "GPU0", "index": 0, "numa_node": 0, "gpu_numa_id": None, "nearest_nics": ["NIC0"]}
    assert gpu0["cpus"] == list(range(16))
    assert data["nics"][1] == {"id": "NIC1", "index": 1, "name": 'eth"0', "pci_bus_id": None, "numa_node": None,
                               "nearest_gpus": ["GPU0", "GPU1", "GPU2", "GPU3"]}
    assert len(data["links"]) == 6 + 8 + 1  # every unordered pair the paste gave
    assert data["links"][0] == {"a": "GPU0", "b": "GPU1", "code": "NV4", "kind": "nvlink", "nvlinks": 4,
                                "bandwidth_gbps": 80.0, "latency_us": 0.6, "p2p": None, "evidence": None}
    assert data["nvlink_islands"] == [["GPU0", "GPU1"], ["GPU2", "GPU3"]]
    assert [w["code"] for w in data["warnings"]] == ["nic-across-sys", "nvlink-split"]
    assert data["arch"] == "sm80" and data["notes"] == []


def test_json_text_keeps_integer_lists_on_one_line():
    data = topology_dict(_two_sockets())
    text = dumps(data)
    assert json.loads(text) == data
    assert '      "cpus": [16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31],\n' in text
    assert '"nearest_nics": [\n        "NIC0"\n      ]' in text  # lists of strings stay as json.dumps wrote them


def test_json_orders_pairs_by_index_not_by_name():
    gpus = [Gpu(f"GPU{i}", i) for i in range(11)]
    codes = {(f"GPU{i}", f"GPU{j}"): "PIX" for i in range(11) for j in range(i + 1, 11)}
    links = topology_dict(build_topology(gpus, [], codes))["links"]
    gpu2_gpu10 = next(l for l in links if {l["a"], l["b"]} == {"GPU2", "GPU10"})
    assert {"a": "GPU2", "b": "GPU10"}.items() <= gpu2_gpu10.items()


def test_atomic_write_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "out.txt"
    write_atomic(target, "first\n")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            open(tmp, "w").write("half")
            raise RuntimeError("interrupted")
    assert target.read_text() == "first\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]
    with pytest.raises(TopoplanError, match="cannot write .*/missing/out.txt"):
        write_atomic(tmp_path / "missing" / "out.txt", "x")
