"""Writing a Topology as NCCL's topology XML (`inspect --format nccl-xml`, a file for NCCL_TOPO_FILE), and saying
what the file says that its source did not. The reader is topoplan.topology.nccl_xml.

Honesty: NCCL matches the <pci> devices of an NCCL_TOPO_FILE to the GPUs and NICs it finds by PCI bus id, so a
device written under a made-up bus id (a `topo -m` paste names none) matches nothing, or the wrong device, and
the links written for it mislead NCCL's search. `export_nccl_xml` says what it made up (`NcclXml.invented`,
one line each: bus ids, PCIe bridges, NUMA ids, the link speed, NODE as PHB, NVLink as direct links), and
`checked_nccl_xml` refuses a file with made-up device bus ids unless the caller allows them (for reading the
file back, not for NCCL). NVSwitch links read from an NCCL dump (Gpu.switch_links) are written back as links
to those switches, as NCCL wrote them, not as direct GPU-to-GPU links.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass

from topoplan.architectures import ARCHITECTURES
from topoplan.errors import TopoplanError
from topoplan.topology.links import LinkKind
from topoplan.topology.model import Topology
from topoplan.topology.nccl_xml import SWITCH_CLASS

BRIDGE_CLASS = "0x060400"  # a PCI-to-PCI bridge (a PCIe switch port)
_SAME_SOCKET = ("PIX", "PXB", "PHB", "NODE")  # PCIe paths that stay inside one socket
# The PCIe link NCCL should assume for a device of each generation: the GT/s string NCCL's dump writes.
_PCIE_SPEED = {12.0: "8.0 GT/s PCIe", 24.0: "16.0 GT/s PCIe", 48.0: "32.0 GT/s PCIe"}
ALLOW_OPTION = "--allow-invented-bus-ids"


@dataclass(frozen=True)
class NcclXml:
    """An NCCL topology XML and what it says that the topology's source did not."""

    text: str
    invented: tuple[str, ...]  # one line each, for stderr
    invented_bus_ids: tuple[str, ...]  # the devices (GPU0, NIC3) written under made-up bus ids


def write_nccl_xml(topology: Topology) -> str:
    """The topology as an NCCL topology XML that NCCL (NCCL_TOPO_FILE) and parse_nccl_xml read back (made-up bus
    ids included: see checked_nccl_xml for a file meant for NCCL)."""
    return export_nccl_xml(topology).text


def checked_nccl_xml(topology: Topology, allow_invented_bus_ids: bool = False) -> NcclXml:
    """export_nccl_xml, refused in one line when a GPU or NIC would get a made-up bus id, unless allowed."""
    export = export_nccl_xml(topology)
    if export.invented_bus_ids and not allow_invented_bus_ids:
        kinds = [(kind, sum(d.startswith(kind) for d in export.invented_bus_ids)) for kind in ("GPU", "NIC")]
        devices = " and ".join(f"{n} {kind}(s)" for kind, n in kinds if n)
        raise TopoplanError(f"no PCI bus id for {devices}; NCCL matches an NCCL_TOPO_FILE's devices by bus id, so "
                            f"made-up ones would mislead it (pass {ALLOW_OPTION} to write them anyway, for reading "
                            "back, not for NCCL)", source=topology.source or None)
    return export


def export_nccl_xml(topology: Topology) -> NcclXml:
    """The topology as an NCCL topology XML, with what it invented.

    Each NUMA node is a <cpu>; PCIe paths are rebuilt as a bridge tree that gives every pair its code (PIX: one
    shared bridge, PXB: a bridge above those, PHB: only the CPU, SYS: another <cpu>). `topo -m`'s NODE is PHB
    inside one NUMA node and SYS between two, as NCCL counts them. Devices whose NUMA node the source did not
    give share the <cpu> of what they reach without SYS; sockets nothing places get numaid -1, -2, ... Bridges
    get made-up bus ids in domains fxxx (as Azure's files use ffff); devices without a bus id get made-up ones
    in index order. A GPU's switch links (read from an NCCL dump) are written to their switches; the rest of
    each pair's NVLink/XGMI count becomes direct <nvlink>/<xgmi> links.
    """
    buses, made_up = _bus_ids(topology)
    speed = _PCIE_SPEED.get(ARCHITECTURES[topology.arch].pcie_gbps) if topology.arch in ARCHITECTURES else None
    root = ET.Element("system", version="1")
    devices = [d.id for d in [*topology.gpus, *topology.nics]]
    sockets = _sockets(topology, devices)
    bridges = 0
    for numaid in sorted(set(sockets.values()), key=lambda n: (n < 0, abs(n))):
        here = [d for d in devices if sockets[d] == numaid]
        cpu = ET.SubElement(root, "cpu", numaid=str(numaid))
        cpus = next((g.cpus for g in topology.gpus if g.id in here and g.cpus), None)
        if cpus:
            cpu.set("affinity", _cpumap(cpus))
        domain = f"f{numaid:03x}" if numaid >= 0 else f"fe{-numaid:02x}"
        for b, group in enumerate(_components(topology, here, ("PIX", "PXB"))):
            parent = cpu
            if len(group) > 1:
                parent = ET.SubElement(cpu, "pci", {"busid": f"{domain}:{b + 1:02x}:00.0", "class": BRIDGE_CLASS})
                bridges += 1
            subgroups = _components(topology, group, ("PIX",))
            for k, sub in enumerate(subgroups):
                holder = parent
                if len(subgroups) > 1:
                    holder = ET.SubElement(parent, "pci", {"busid": f"{domain}:{b + 1:02x}:{k + 1:02x}.0",
                                                           "class": BRIDGE_CLASS})
                    bridges += 1
                for device in sub:
                    _write_device(topology, holder, device, buses, speed)
    ET.indent(root, space="  ")
    invented = _invented(topology, made_up, bridges, sorted({n for n in sockets.values() if n < 0}), speed)
    return NcclXml(ET.tostring(root, encoding="unicode") + "\n", tuple(invented), tuple(made_up))


def _invented(topology: Topology, made_up: list[str], bridges: int, numaids: list[int],
              speed: str | None) -> list[str]:
    """What the file says that the source did not, one line each (device ids only: no text from the input)."""
    out = []
    if made_up:
        out.append(f"made-up PCI bus ids for {', '.join(made_up)} (the source gives none)")
    if bridges:
        out.append(f"{bridges} PCIe bridge(s) with made-up bus ids (domains fxxx) stand for the PIX/PXB paths")
    if numaids:
        out.append(f"made-up NUMA ids {', '.join(map(str, numaids))} for sockets the source does not number")
    if speed:
        out.append(f"PCIe link speed {speed} x16 assumed from the GPU generation ({topology.arch})")
    if any(link.code == "NODE" for link in topology.links()):
        out.append("`topo -m`'s NODE written as PHB inside a NUMA node and SYS between two (NCCL has no NODE)")
    fabric = [link for link in topology.links() if link.kind.is_fabric]
    if fabric and not any(g.switch_links for g in topology.gpus):
        out.append(f"{len(fabric)} NVLink/XGMI GPU pair(s) written as direct links: the source lists no switches "
                   "(on an NVSwitch machine NCCL then sees direct links it does not have)")
    return out


def _sockets(topology: Topology, devices: list[str]) -> dict[str, int]:
    """The numaid each device is written under: its NUMA node; else that of the nearest device with one that it
    reaches over PCIe without SYS; else a made-up negative id shared by the devices it reaches that way."""
    nodes = topology.graph.nodes
    out = {d: nodes[d]["device"].numa_node for d in devices if nodes[d]["device"].numa_node is not None}
    for device in devices:
        if device in out:
            continue
        near = sorted((topology.link(device, other).kind.rank, k, other) for k, other in enumerate(devices)
                      if other in out and _code(topology, device, other) in _SAME_SOCKET)
        if near:
            out[device] = out[near[0][2]]
    rest = [d for d in devices if d not in out]
    for k, group in enumerate(_components(topology, rest, _SAME_SOCKET)):
        out.update({d: -1 - k for d in group})
    return out


def _components(topology: Topology, members: list[str], codes: tuple[str, ...]) -> list[list[str]]:
    """Members joined, directly or through each other, by links whose code starts with one of `codes`; in
    device order (a union-find over the pairs)."""
    parent = {m: m for m in members}

    def find(m: str) -> str:
        while parent[m] != m:
            parent[m] = parent[parent[m]]
            m = parent[m]
        return m

    for i, a in enumerate(members):
        for b in members[i + 1:]:
            code = _code(topology, a, b)
            if code is not None and code.startswith(codes):
                parent[find(b)] = find(a)
    groups: dict[str, list[str]] = {}
    for m in members:
        groups.setdefault(find(m), []).append(m)
    return list(groups.values())


def _code(topology: Topology, a: str, b: str) -> str | None:
    data = topology.graph.get_edge_data(a, b)
    return data["link"].code if data and data.get("kind") == "link" else None


def _switched(topology: Topology, gpu_id: str, tag: str) -> int:
    """The GPU's links of kind `tag` (nvlink, xgmi) to switches."""
    device = topology.graph.nodes[gpu_id]["device"]
    return sum(count for kind, _, count in device.switch_links if kind == tag)


def _write_device(topology: Topology, parent: ET.Element, device_id: str, buses: dict[str, str],
                  speed: str | None) -> None:
    node = topology.graph.nodes[device_id]
    device = node["device"]
    if device_id not in buses:  # a NIC NCCL found no PCI place for, as it writes one: a bare <nic>
        ET.SubElement(ET.SubElement(parent, "nic"), "net", name=device.name or f"net{device.index}",
                      dev=str(device.index))
        return
    attrs = {"busid": buses[device_id], "class": "0x030200" if node["kind"] == "gpu" else "0x020700"}
    if speed:
        attrs |= {"link_speed": speed, "link_width": "16"}
    pci = ET.SubElement(parent, "pci", attrs)
    if node["kind"] == "nic":
        if device.name:
            nic = ET.SubElement(pci, "nic")
            ET.SubElement(nic, "net", name=device.name, dev=str(device.index))
        return
    gpu_attrs = {"dev": str(device.index), "rank": str(device.index), "gdr": "1"}
    arch = topology.arch or ""
    if arch.startswith("sm"):
        gpu_attrs["sm"] = arch[2:]
    elif arch.startswith("gfx"):
        gpu_attrs["gcn"] = arch
    gpu = ET.SubElement(pci, "gpu", gpu_attrs)
    for tag, switch, count in device.switch_links:  # as the dump listed them
        ET.SubElement(gpu, tag, target=switch, count=str(count), tclass=SWITCH_CLASS)
    for peer in topology.gpus:
        if peer.id == device_id or not topology.graph.has_edge(device_id, peer.id):
            continue
        link = topology.link(device_id, peer.id)
        if link.kind.is_fabric:
            tag = "nvlink" if link.kind is LinkKind.NVLINK else "xgmi"
            # the reader counts a pair's switch links as the smaller of the two GPUs' (nccl_xml._fabric_counts)
            direct = link.nvlinks - min(_switched(topology, device_id, tag), _switched(topology, peer.id, tag))
            if direct > 0:
                ET.SubElement(gpu, tag, target=buses[peer.id], count=str(direct), tclass="0x030200")


def _bus_ids(topology: Topology) -> tuple[dict[str, str], list[str]]:
    """Each device's bus id in NCCL's spelling (0000:1b:00.0), and the devices whose ids are made up. GPUs get
    made-up ones in index order (domain 0000) unless every GPU has one; a NIC without one gets a made-up one
    (domain 0001), except a lone named NIC with no PCIe switch in common with a GPU, written as a bare <nic> as
    NCCL writes a VM's virtual NIC."""
    out: dict[str, str] = {}
    made_up: list[str] = []
    known = all(g.pci_bus_id for g in topology.gpus)
    for k, gpu in enumerate(topology.gpus):
        if known and gpu.pci_bus_id:
            out[gpu.id] = _nccl_busid(gpu.pci_bus_id)
        else:
            out[gpu.id] = f"0000:{k + 1:02x}:00.0"
            made_up.append(gpu.id)
    for k, nic in enumerate(topology.nics):
        if nic.pci_bus_id:
            out[nic.id] = _nccl_busid(nic.pci_bus_id)
        elif len(topology.nics) > 1 or not nic.name or any(
                _code(topology, nic.id, other.id) in ("PIX", "PXB") for other in topology.gpus):
            out[nic.id] = f"0001:{k + 1:02x}:00.0"
            made_up.append(nic.id)
    return out, made_up


def _nccl_busid(busid: str) -> str:
    """NVML's 00000000:1B:00.0 as NCCL writes it: 0000:1b:00.0."""
    domain, rest = busid.lower().split(":", 1)
    return f"{int(domain, 16):04x}:{rest}"


def _cpumap(cpus: tuple[int, ...]) -> str:
    value = sum(1 << c for c in cpus)
    words = max(1, (max(cpus) // 32) + 1)
    return ",".join(f"{value >> (32 * w) & 0xffffffff:08x}" for w in reversed(range(words)))
