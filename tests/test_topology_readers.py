"""The NCCL topology XML, rocm-smi and amd-smi readers: every real output in fixtures/nccl and fixtures/amd
against its hand-written expectation (fixtures/*/expected, see each SOURCES.md), refusals of damaged input
with file, line and what was expected, the XML export round trip, and detection by content."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from topoplan.cli import app
from topoplan.errors import TopoplanError
from topoplan.topology.amd_text import parse_amd_smi_topology, parse_rocm_smi_topo
from topoplan.topology.nccl_xml import MAX_CHARS, parse_nccl_xml
from topoplan.topology.nccl_xml_write import write_nccl_xml
from topoplan.topology.read import detect_format, read_topology

ROOT = Path(__file__).resolve().parent.parent / "fixtures"
AMD = sorted((ROOT / "amd" / "expected").glob("*.json"))
XML = sorted((ROOT / "nccl" / "expected").glob("*.json"))
TOPO = sorted(p for p in (ROOT / "topo").glob("*.txt") if ".p2p" not in p.name and ".measured" not in p.name)
runner = CliRunner()


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _pairs(topo) -> dict[str, object]:
    return {f"{l.a}-{l.b}": l for l in topo.links()}


def test_every_bundled_output_has_an_expectation():
    assert sorted(_load(p)["file"] for p in AMD) == sorted(p.name for p in (ROOT / "amd").glob("*.txt"))
    assert sorted(_load(p)["file"] for p in XML) == sorted(p.name for p in (ROOT / "nccl").glob("*.xml"))
    assert len(AMD) == 5 and len(XML) == 6


@pytest.mark.parametrize("expected_path", AMD, ids=lambda p: p.stem)
def test_amd_output_matches_expectation(expected_path):
    expected = _load(expected_path)
    path = ROOT / "amd" / expected["file"]
    assert detect_format(path.read_text()) == expected["tool"].split()[0]
    topo = read_topology(str(path))
    assert topo.vendor == "amd" and topo.nics == () and topo.notes == ()
    assert [(g.id, g.numa_node, g.pci_bus_id) for g in topo.gpus] == \
        [(g["id"], g["numa_node"], g["pci_bus_id"]) for g in expected["gpus"]]
    links = _pairs(topo)
    assert sorted(links) == sorted(expected["links"])
    for pair, want in expected["links"].items():
        link = links[pair]
        assert (link.code, link.evidence) == (want["code"], want["evidence"]), pair
        assert (dict(link.p2p) if link.p2p else None) == want["p2p"], pair


@pytest.mark.parametrize("expected_path", XML, ids=lambda p: p.stem)
def test_nccl_xml_matches_expectation(expected_path):
    expected = _load(expected_path)
    path = ROOT / "nccl" / expected["file"]
    assert detect_format(path.read_text()) == "nccl-xml"
    topo = read_topology(str(path))
    assert (topo.arch, topo.vendor) == (expected["arch"], expected["vendor"])
    assert len(topo.notes) == len(expected["notes"])  # hint files say what they lack, dumps need no note
    assert [(g.id, g.pci_bus_id, g.numa_node, list(g.cpus)) for g in topo.gpus] == \
        [(g["id"], g["pci_bus_id"], g["numa_node"], g["cpus"]) for g in expected["gpus"]]
    assert [(n.id, n.name, n.pci_bus_id, n.numa_node) for n in topo.nics] == \
        [(n["id"], n["name"], n["pci_bus_id"], n["numa_node"]) for n in expected["nics"]]
    got = {pair: link.code for pair, link in _pairs(topo).items() if pair.startswith("GPU")}
    assert got == expected["links"]
    assert all(link.evidence.startswith("NCCL XML: ") for link in topo.links())


def test_nvswitch_links_count_once_per_pair_and_say_so():
    topo = read_topology(str(ROOT / "nccl" / "ibm-cloud-h100-8gpu-nvswitch-8nic-dump.xml"))
    link = topo.link("GPU0", "GPU7")  # each GPU: 5 + 5 + 4 + 4 links to the four NVSwitches
    assert (link.code, link.nvlinks, link.evidence) == ("NV18", 18, "NCCL XML: <nvlink> 0 direct + 18 through switches")
    assert topo.link("GPU0", "NIC7").evidence == "NCCL XML: 1 PCI bridge(s) between them, below 0000:a1:00.0"
    assert [n.name for n in topo.nearest_nics("GPU3")] == ["mlx5_4"]


def test_amd_pcie_pair_without_peer_access_gets_a_p2p_level():
    topo = read_topology(str(ROOT / "amd" / "amd-smi-rx7900xtx-2gpu-pcie-rocm-issue6074.txt"))
    from topoplan.launch.nccl_env import p2p_level

    level, notes = p2p_level(topo, ["GPU0", "GPU1"])
    assert (level.name, level.value) == ("NCCL_P2P_LEVEL", "PXB") and notes == []  # PHB fails: only up to PXB


# --- round trip: read -> write NCCL XML -> read -----------------------------------------------------------
def _graph(topo) -> tuple:
    return ([(g.id, g.index, g.pci_bus_id, g.numa_node, g.cpus) for g in topo.gpus],
            [(n.id, n.name, n.pci_bus_id, n.numa_node) for n in topo.nics],
            [(l.a, l.b, l.code, l.nvlinks) for l in topo.links()], topo.arch, topo.vendor)


@pytest.mark.parametrize("path", [ROOT / "nccl" / _load(p)["file"] for p in XML], ids=lambda p: p.stem)
def test_xml_round_trip_gives_the_same_graph(path):
    first = read_topology(str(path))
    again = parse_nccl_xml(write_nccl_xml(first), "again.xml")
    assert _graph(again) == _graph(first)
    twice = parse_nccl_xml(write_nccl_xml(again), "twice.xml")
    assert write_nccl_xml(twice) == write_nccl_xml(again)  # the writer's own output is a fixed point


OTHER_SOURCES = [*TOPO, *sorted((ROOT / "amd").glob("*.txt")), *sorted((ROOT / "nvml").glob("*.json"))]


@pytest.mark.parametrize("path", OTHER_SOURCES, ids=lambda p: p.stem[:24])
def test_other_sources_export_what_nccl_can_say(path):
    """A `topo -m` or AMD graph written as XML and read back keeps every GPU and NIC, every fabric link and
    every PIX/PXB/SYS path; NODE becomes PHB (NCCL has no NODE); bus ids it lacked are made up in index order.
    NVML recordings keep their real bus ids."""
    first = read_topology(str(path))
    again = parse_nccl_xml(write_nccl_xml(first), "again.xml")
    assert [g.id for g in again.gpus] == [g.id for g in first.gpus]
    assert [(n.id, n.name) for n in again.nics] == [(n.id, n.name) for n in first.nics]
    # a NIC without a NUMA node goes under the socket of a GPU it reaches without SYS
    assert all(n.numa_node == m.numa_node for n, m in zip(first.nics, again.nics) if n.numa_node is not None)
    assert [g.numa_node for g in again.gpus] == [g.numa_node for g in first.gpus]
    if all(g.pci_bus_id for g in first.gpus):
        assert [g.pci_bus_id for g in again.gpus] == [_nccl_spelling(g.pci_bus_id) for g in first.gpus]
    numa = {d.id: d.numa_node for d in [*again.gpus, *again.nics]}
    want = {(l.a, l.b): (("PHB" if numa[l.a] == numa[l.b] else "SYS") if l.code == "NODE" else l.code)
            for l in first.links()}
    got = {(l.a, l.b): l.code for l in again.links() if (l.a, l.b) in want}
    assert got == want


def _nccl_spelling(busid: str) -> str:
    """NVML's 00000000:1B:00.0 as NCCL writes it, by hand: a 4-digit domain, lower case."""
    domain, rest = busid.split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"


def test_inspect_writes_nccl_xml(tmp_path):
    out = tmp_path / "topo.xml"
    path = ROOT / "topo" / "30_hgx-a100-4gpu-nv4-4nic-rst-indented.txt"
    result = runner.invoke(app, ["inspect", "--file", str(path), "--format", "nccl-xml", "-o", str(out),
                                 "--allow-invented-bus-ids"])  # a paste has none (tests/test_nccl_xml_export.py)
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert text.startswith('<system version="1">\n  <cpu numaid="0" affinity="0000ffff">')
    assert text.count('<nvlink target="0000:') == 12 and 'count="4"' in text  # NV4, both directions
    assert '<net name="mlx5_0" dev="0"' in text
    assert read_topology(str(out)).link("GPU0", "GPU3").code == "NV4"


def test_p2p_matrix_goes_only_with_topo_m_text(tmp_path):
    p2p = tmp_path / "p2p.txt"
    p2p.write_text(" \tGPU0\tGPU1\t\n GPU0\tX\tOK\t\n GPU1\tOK\tX\t\n")
    result = runner.invoke(app, ["inspect", "--file", str(ROOT / "nccl" / "azure-ndv2-v100-8gpu-flat-hint.xml"),
                                 "--p2p", str(p2p)])
    assert result.exit_code == 2
    assert result.output.strip() == f"topoplan: error: {p2p}: --p2p goes with `topo -m` text, not with a nccl-xml file"


# --- refusals: one line, file and line, what was expected ------------------------------------------------
def _refusal(reader, text: str) -> TopoplanError:
    with pytest.raises(TopoplanError) as caught:
        reader(text, "bad")
    assert caught.value.source == "bad" and caught.value.line is not None
    return caught.value


XML_TEXT = (ROOT / "nccl" / "azure-ncv4-a100-4gpu-nv12-pairs-dump.xml").read_text()


@pytest.mark.parametrize(("text", "line", "message"), [
    ('<!DOCTYPE system [<!ENTITY a "aaaa">]>\n<system version="1"/>', 1, "declares a DOCTYPE"),
    ('<system version="1">\n<!ENTITY lol "lol">\n</system>', 2, "declares a ENTITY"),
    (XML_TEXT.replace("</gpu>", "</gpux>", 1), 6, "not well-formed XML"),
    (XML_TEXT[:900], None, "not well-formed XML"),
    (XML_TEXT.replace('<system version="1">', '<system version="7">'), 1, "versions 1, 2"),
    (XML_TEXT.replace('busid="0002:00:00.0"', 'busid="0002:00"'), 13, "expected a PCI bus id"),
    (XML_TEXT.replace('count="12"', 'count="twelve"', 1), 5, "expected a whole number"),
    (XML_TEXT.replace('count="12"', 'count="0"', 1), 5, "count=\"<links>\" of at least 1"),
    (XML_TEXT.replace('name="eth0"', 'name=""'), 9, "<net> without a name"),
    (XML_TEXT.replace('busid="0003:00:00.0"', 'busid="0001:00:00.0"'), 20, "appears twice (first on line 3)"),
    ('<system version="1"><cpu numaid="0"/></system>', 1, "no GPU in the file"),
    ('<system version="1">\n <cpu numaid="zero"></cpu></system>', 2, "numaid='zero': expected a whole number"),
    ('<system version="1">\n <cpu numaid="0" affinity="zz"></cpu></system>', 2, "expected a CPU mask"),
])
def test_damaged_xml_is_refused_with_its_line(text, line, message):
    error = _refusal(parse_nccl_xml, text)
    assert message in error.message
    if line is not None:
        assert error.line == line


def test_oversized_xml_is_refused_before_parsing():
    error = _refusal(parse_nccl_xml, '<system version="1">' + " " * MAX_CHARS + "</system>")
    assert "larger than any topology file" in error.message


def test_wrong_root_is_not_taken_for_nccl_xml():
    assert detect_format("<graphs version=\"1\"></graphs>") == "smi-text"  # falls to the topo -m reader's message
    assert detect_format("<?xml version=\"1.0\"?>\n<!-- dumped -->\n" + XML_TEXT) == "nccl-xml"


ROCM_TEXT = (ROOT / "amd" / "rocm-smi-mi210-4gpu-xgmi-4numa-archer2.txt").read_text()
AMD_TEXT = (ROOT / "amd" / "amd-smi-rx7900xtx-2gpu-pcie-rocm-issue6074.txt").read_text()


@pytest.mark.parametrize(("reader", "text", "line", "message"), [
    (parse_rocm_smi_topo, ROCM_TEXT.replace("GPU2   XGMI         XGMI         0            XGMI",
                                            "GPU2   XGMI         XGMI         0"), 20, "3 cells, expected 4"),
    (parse_rocm_smi_topo, ROCM_TEXT.replace("GPU1   XGMI         0            XGMI         XGMI",
                                            "GPU1   XGMI         0            NVL          XGMI").replace(
                                            "GPU2   XGMI         XGMI         0", "GPU2   XGMI         NVL          0"),
     19, "unknown link type 'NVL' to GPU2; expected XGMI or PCIE"),
    (parse_rocm_smi_topo, ROCM_TEXT.replace("GPU3   15           15           15           0",
                                            "GPU3   15           15           30           0"), 7, "not symmetric"),
    (parse_rocm_smi_topo, ROCM_TEXT.replace("GPU0   0            1 ", "GPU0   2            1 "), 11,
     "expected 0 on the diagonal, found '2'"),
    (parse_rocm_smi_topo, ROCM_TEXT.split("========================== Link Type")[0], 1, "no link type table"),
    (parse_rocm_smi_topo, ROCM_TEXT.replace("GPU 3          : (Topology) Numa Node: 3\n", ""), 23,
     "Numa Nodes block names GPUs [0, 1, 2]"),
    (parse_rocm_smi_topo, ROCM_TEXT.replace("GPU 1          : (Topology) Numa Affinity: 1",
                                            "GPU 1 is missing"), 27, "expected 'GPU[<n>] : (Topology) Numa Node"),
    (parse_amd_smi_topology, AMD_TEXT.replace("0000:0c:00.0 PCIE         SELF", "0000:0c:00.0 PCIE"), 16,
     "1 cells, expected 2"),
    (parse_amd_smi_topology, AMD_TEXT.replace("0000:0c:00.0 2            0", "0000:0d:00.0 2            0"), 12,
     "expected row 0000:0c:00.0"),
    (parse_amd_smi_topology, AMD_TEXT.replace("0000:0c:00.0 40           0", "0000:0c:00.0 forty        0").replace(
        "0000:03:00.0 0            40", "0000:03:00.0 0            forty"), 7,
     "expected a whole number, found 'forty'"),
    (parse_amd_smi_topology, AMD_TEXT.split("NUMA BW TABLE:")[0].rsplit("\n", 2)[0], 13,
     "'link type' table has no row 0000:0c:00.0"),
])
def test_damaged_amd_output_is_refused_with_its_line(reader, text, line, message):
    error = _refusal(reader, text)
    assert message in error.message and error.line == line


# --- robustness ------------------------------------------------------------------------------------------
TEXTS = [p.read_text() for p in sorted((ROOT / "amd").glob("*.txt"))] + \
        [p.read_text() for p in sorted((ROOT / "nccl").glob("*.xml"))]
NOISE = st.sampled_from(list("<>/=\" \n0123456789abcdefXGMIPCE:.") + ["<pci", "</cpu>", "GPU0", "SELF", "&lt;"])


@st.composite
def mutated(draw):
    text = draw(st.sampled_from(TEXTS))
    for _ in range(draw(st.integers(1, 3))):
        lines = text.split("\n")
        i = draw(st.integers(0, len(lines) - 1))
        kind = draw(st.sampled_from(["delete", "duplicate", "insert", "drop", "truncate"]))
        if kind == "delete":
            del lines[i]
        elif kind == "duplicate":
            lines.insert(i, lines[i])
        elif kind == "truncate":
            lines = lines[:i]
        else:
            at = draw(st.integers(0, len(lines[i])))
            lines[i] = lines[i][:at] + (draw(NOISE) if kind == "insert" else "") + lines[i][at + (kind == "drop"):]
        text = "\n".join(lines)
    return text


@settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_outputs_parse_or_raise_a_located_topoplan_error(text):
    fmt = detect_format(text)
    reader = {"nccl-xml": parse_nccl_xml, "rocm-smi": parse_rocm_smi_topo, "amd-smi": parse_amd_smi_topology}.get(fmt)
    if reader is None:
        return  # damaged beyond recognition: the topo -m reader's refusals are tested in test_smi_fuzz
    try:
        topo = reader(text, "fuzz")
    except TopoplanError as error:
        assert error.source == "fuzz" and error.line is not None and "\n" not in error.message
        return
    n = len(topo.gpus)
    assert n and len([l for l in topo.links() if re.match(r"GPU\d+$", l.b)]) == n * (n - 1) // 2
