"""`inspect --format nccl-xml` is honest: NVSwitch links read from an NCCL dump are written back to their switches
(not as direct GPU-to-GPU links), what the file makes up is said on stderr, and a file with made-up device bus ids
(NCCL matches NCCL_TOPO_FILE's devices by bus id) is refused in one line unless --allow-invented-bus-ids."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from topoplan import cli
from topoplan.topology.nccl_xml import parse_nccl_xml
from topoplan.topology.read import read_topology

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
DUMPS = sorted((FIXTURES / "nccl").glob("*.xml"))
IBM_H100 = FIXTURES / "nccl" / "ibm-cloud-h100-8gpu-nvswitch-8nic-dump.xml"
PASTE = FIXTURES / "topo" / "30_hgx-a100-4gpu-nv4-4nic-rst-indented.txt"


def inspect(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """`topoplan inspect ARGS` in-process: (exit code, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", ["topoplan", "inspect", *args])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    captured = capsys.readouterr()
    return exit_.value.code, captured.out, captured.err


def fabric_links(text: str) -> dict[str, list[tuple[str, str, str, str]]]:
    """Per GPU bus id, its <nvlink>/<xgmi> children as (tag, target, count, tclass), sorted: read with
    ElementTree by hand, not with topoplan's reader."""
    out = {}
    for pci in ET.fromstring(text).iter("pci"):
        gpu = pci.find("gpu")
        if gpu is not None:
            out[pci.get("busid")] = sorted((link.tag, link.get("target"), link.get("count"), link.get("tclass"))
                                           for link in gpu if link.tag in ("nvlink", "xgmi"))
    return out


def switch_links(text: str) -> dict[str, list[tuple[str, str, str, str]]]:
    """Per GPU bus id, its links to switches (tclass 0x068000), for the GPUs that have any."""
    switched = {bus: [link for link in links if link[3] == "0x068000"] for bus, links in fabric_links(text).items()}
    return {bus: links for bus, links in switched.items() if links}


@pytest.mark.parametrize("path", DUMPS, ids=lambda p: p.stem)
def test_bundled_dumps_round_trip_with_their_switch_links(monkeypatch, capsys, path):
    """Each bundled NCCL file exports without a refusal (its bus ids are real) and keeps every switch link it
    had, per GPU, with its target and count; read back, every pair has the same link code."""
    code, out, err = inspect(monkeypatch, capsys, "--file", str(path), "--format", "nccl-xml")
    assert code == 0, err
    source = path.read_text()
    assert switch_links(out) == switch_links(source)
    assert "made-up PCI bus ids" not in err
    first, again = read_topology(str(path)), parse_nccl_xml(out, "again.xml")
    assert [(link.a, link.b, link.code) for link in again.links()] == \
        [(link.a, link.b, link.code) for link in first.links()]


def test_nvswitch_dump_is_written_with_its_switches_not_direct_links(monkeypatch, capsys):
    """The IBM Cloud H100 dump: each GPU has 5+5+4+4 links to the four NVSwitches f3..f6 (NV18 between every pair).
    The export lists those 32 switch links and no GPU-to-GPU link (the old export wrote 56 direct NV18 links)."""
    code, out, err = inspect(monkeypatch, capsys, "--file", str(IBM_H100), "--format", "nccl-xml")
    assert code == 0, err
    links = fabric_links(out)
    assert len(links) == 8
    for gpu_links in links.values():
        assert sorted((target, count) for _, target, count, _ in gpu_links) == \
            [("0000:f3:00.0", "4"), ("0000:f4:00.0", "5"), ("0000:f5:00.0", "5"), ("0000:f6:00.0", "4")]
        assert {tclass for *_, tclass in gpu_links} == {"0x068000"}
    again = parse_nccl_xml(out, "again.xml")
    assert {link.code for link in again.links() if link.a.startswith("GPU") and link.b.startswith("GPU")} == {"NV18"}
    assert "written as direct links" not in err  # the switches were kept


def test_a_paste_is_refused_without_the_option_and_nothing_is_written(monkeypatch, capsys, tmp_path):
    out = tmp_path / "topo.xml"
    code, stdout, err = inspect(monkeypatch, capsys, "--file", str(PASTE), "--format", "nccl-xml", "-o", str(out))
    assert code == 2 and stdout == ""
    assert err == (f"topoplan: error: {PASTE}: no PCI bus id for 4 GPU(s) and 4 NIC(s); NCCL matches an "
                   "NCCL_TOPO_FILE's devices by bus id, so made-up ones would mislead it (pass "
                   "--allow-invented-bus-ids to write them anyway, for reading back, not for NCCL)\n")
    assert not out.exists()


def test_a_paste_with_the_option_says_on_stderr_what_it_made_up(monkeypatch, capsys):
    code, out, err = inspect(monkeypatch, capsys, "--file", str(PASTE), "--format", "nccl-xml",
                             "--allow-invented-bus-ids")
    assert code == 0, err
    notes = err.splitlines()
    assert all(line.startswith("topoplan: note: nccl-xml: ") for line in notes)
    assert "topoplan: note: nccl-xml: made-up PCI bus ids for GPU0, GPU1, GPU2, GPU3, NIC0, NIC1, NIC2, NIC3 " \
           "(the source gives none)" in notes
    # 4 GPUs joined by NV4 pairs: 6 pairs, and no switch in a paste
    assert any("6 NVLink/XGMI GPU pair(s) written as direct links: the source lists no switches" in n for n in notes)
    assert any("PCIe link speed 16.0 GT/s PCIe x16 assumed from the GPU generation (sm80)" in n for n in notes)
    assert '<pci busid="0000:01:00.0"' in out  # GPU0's made-up id, in index order


def test_the_option_goes_with_nccl_xml_only(monkeypatch, capsys):
    code, out, err = inspect(monkeypatch, capsys, "--file", str(PASTE), "--json", "--allow-invented-bus-ids")
    assert code == 2 and out == ""
    assert err == "topoplan: error: --allow-invented-bus-ids goes with --format nccl-xml, not json\n"
