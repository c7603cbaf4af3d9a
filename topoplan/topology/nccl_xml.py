"""NCCL's topology XML (what `NCCL_TOPO_DUMP_FILE` writes and `NCCL_TOPO_FILE` reads; RCCL writes the same
with `<xgmi>`): read it into a Topology (topoplan.topology.nccl_xml_write writes one back out).

The file is a tree: `<system version>` > `<cpu numaid affinity ...>` (a NUMA node) > nested `<pci busid class
link_speed link_width>` (bridges, then devices) > `<gpu dev sm rank gdr>` with `<nvlink|xgmi target count
tclass>` children, or `<nic>` > `<net name dev speed port guid maxconn gdr>`. Two shapes are read:
- the dump: devices carry `<gpu>` / `<nic><net>` children (NCCL 2.7 and later, `version="1"` or `"2"`);
- the hint file cloud providers ship for VMs (Azure's NDv2/NDv4/NDv5): only `<pci class>` leaves, a GPU being
  PCI class 0x03xxxx and a NIC 0x02xxxx, with no NVLink and no NIC names (NCCL fills those in at run time).

Link codes follow NCCL's own path types: NVLink counts (direct, plus through NVSwitch: `tclass="0x068000"`, the
smaller of the two GPUs' switch links), XGMI counts likewise; PCIe paths from the tree: at most one bridge
between two devices is PIX, more is PXB, meeting only at the CPU is PHB (NCCL has no NODE), different `<cpu>`
is SYS. GPUs are numbered in PCI bus order (as nvidia-smi and NVML do), not by NCCL's `dev`.

Safety: the text is capped at MAX_CHARS and any DOCTYPE or ENTITY declaration is refused before xml.etree
sees it, so no entity expansion ("billion laughs") or external entity can happen.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from xml.parsers import expat

from topoplan.cpuset import MAX_CPU
from topoplan.errors import TopoplanError
from topoplan.limits import MAX_DEPTH, MAX_ELEMENTS, MAX_GPUS_PER_NODE, MAX_NICS_PER_NODE, MAX_NUMA_NODE, whole_number
from topoplan.topology.model import Gpu, Nic, Topology, build_topology

MAX_CHARS = 4_000_000  # a 72-GPU dump is ~100 kB; anything this large is not a topology file
VERSIONS = ("1", "2")
SWITCH_CLASS = "0x068000"  # NVSwitch, as NCCL's tclass names it
_BUSID = re.compile(r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-9a-fA-F]$")
_FORBIDDEN = re.compile(r"<!\s*(DOCTYPE|ENTITY)", re.IGNORECASE)
_BLANKS = re.compile(r"[\ufeff\s]*")
_VENDORS = {"0x10de": "nvidia", "0x1002": "amd"}
GPU_CLASSES = ("0x03", "0x12")  # display/3D controller; processing accelerator (how MI300X shows in a VM)
# Older RCCL writes `gcn` as HIP's numeric gcnArch (gfx90a = 910); newer writes the gfx name.
GCN_NAMES = {"906": "gfx906", "908": "gfx908", "910": "gfx90a", "940": "gfx940", "941": "gfx941", "942": "gfx942",
             "950": "gfx950", "1100": "gfx1100", "1201": "gfx1201"}
EXPECTED = "expected an NCCL topology XML (NCCL_TOPO_DUMP_FILE output or an NCCL_TOPO_FILE)"


@dataclass(frozen=True)
class _Cpu:
    """One <cpu> element: a NUMA node and its CPUs."""

    index: int  # which <cpu> element (a negative or repeated numaid still names a distinct CPU)
    numa: int | None  # numaid; None when -1 (unknown)
    cpus: tuple[int, ...] | None


@dataclass
class _Device:
    """A GPU or NIC as the file places it."""

    kind: str  # "gpu" or "nic"
    busid: str | None
    cpu: _Cpu
    chain: tuple[str, ...]  # bus ids of the <pci> elements above it and itself, top first
    line: int
    sm: str | None = None
    gcn: str | None = None
    dev: int | None = None
    vendor: str | None = None
    name: str | None = None
    dumped: bool = False  # described by a <gpu> element (a dump), not only by its PCI class (a hint file)
    fabric: list[tuple[str, str, int, str, int]] = field(default_factory=list)  # (tag, target, count, tclass, line)


def looks_like_nccl_xml(text: str) -> bool:
    """An XML document whose root element is <system> (after an optional declaration and comments). Each
    leading declaration or comment is skipped with one find, so the check stays linear whatever the text."""
    at = _BLANKS.match(text).end()
    while text.startswith(("<?", "<!--"), at):
        end = text.find("?>" if text.startswith("<?", at) else "-->", at)
        if end < 0:
            return False
        at = end + (2 if text.startswith("<?", at) else 3)
        at = _BLANKS.match(text, at).end()
    return text.startswith("<system", at)


# --- reading ------------------------------------------------------------------------------------------------
def parse_nccl_xml(text: str, source: str = "<xml>") -> Topology:
    """Parse an NCCL topology XML. Raises TopoplanError(source, line) on damaged or unsafe input."""
    root, lines = _parse(text, source)
    if root.tag != "system":
        raise TopoplanError(f"the root element is <{root.tag}>; {EXPECTED}, whose root is <system>",
                            source=source, line=lines.get(root, 1))
    version = root.get("version")
    if version not in VERSIONS:
        raise TopoplanError(f"<system version={version!r}>: this reader knows NCCL topology versions "
                            f"{', '.join(VERSIONS)}", source=source, line=lines.get(root, 1))
    devices: list[_Device] = []
    seen: dict[str, int] = {}
    for k, cpu in enumerate(c for c in root if c.tag == "cpu"):
        numa = _int_attr(cpu, "numaid", lines, source, allow_negative=True)
        if numa is not None and numa > MAX_NUMA_NODE:
            raise TopoplanError(f"<cpu numaid={cpu.get('numaid')!r}>: NUMA node {numa}; Linux numbers them 0 to "
                                f"{MAX_NUMA_NODE}", source=source, line=lines.get(cpu, 1))
        cpus = _affinity(cpu.get("affinity"), lines.get(cpu, 1), source)
        place = _Cpu(k, numa if numa is not None and numa >= 0 else None, cpus)
        _walk(cpu, (), place, devices, seen, lines, source)
    gpus = sorted((d for d in devices if d.kind == "gpu"), key=lambda d: _bus_key(d.busid))
    if not gpus:
        raise TopoplanError(f"no GPU in the file (no <gpu>, no <pci> of class 0x03xxxx or 0x12xxxx); {EXPECTED}",
                            source=source, line=1)
    # NICs in NCCL's own order (`<net dev>`, the order it lists network devices), then unnamed ones in bus order
    nics = sorted((d for d in devices if d.kind == "nic"),
                  key=lambda d: (d.dev is None, d.dev if d.dev is not None else 0, _bus_key(d.busid)))
    notes: list[str] = []
    if not any(g.dumped for g in gpus):
        notes.append("no <gpu> elements (a hint file for NCCL_TOPO_FILE): NVLink/XGMI are not described, GPU "
                     "pairs are PCIe paths only, and NICs have no names")
    devs = [g.dev for g in gpus]
    if all(d is not None for d in devs) and devs != sorted(devs):
        notes.append(f"NCCL numbered these GPUs {devs} (its CUDA device order); topoplan numbers them in PCI bus "
                     "order as nvidia-smi does")
    ids = {id(d): f"GPU{i}" for i, d in enumerate(gpus)} | {id(d): f"NIC{k}" for k, d in enumerate(nics)}
    codes: dict[tuple[str, str], str] = {}
    evidence: dict[tuple[str, str], str] = {}
    fabric = _fabric_counts(gpus, ids, notes)
    everything = [*gpus, *nics]
    for i, a in enumerate(everything):
        for b in everything[i + 1:]:
            pair = (ids[id(a)], ids[id(b)])
            if pair in fabric:
                codes[pair], evidence[pair] = fabric[pair]
            else:
                codes[pair], evidence[pair] = _pci_code(a, b)
    arch, vendor = _arch(gpus, notes)
    return build_topology(
        [Gpu(ids[id(d)], i, pci_bus_id=d.busid, cpus=d.cpu.cpus, numa_node=d.cpu.numa,
             switch_links=tuple((tag, target, n) for tag, target, n, tclass, _ in d.fabric if tclass == SWITCH_CLASS))
         for i, d in enumerate(gpus)],
        [Nic(ids[id(d)], k, name=d.name, pci_bus_id=d.busid, numa_node=d.cpu.numa) for k, d in enumerate(nics)],
        codes, arch=arch, source=source, notes=notes, evidence=evidence, vendor=vendor)


def _parse(text: str, source: str) -> tuple[ET.Element, dict[ET.Element, int]]:
    """The element tree and each element's line, refusing oversized or entity-declaring input.

    Built from expat's start/end events rather than by xml.etree, so the reader counts as it goes: nesting deeper
    than MAX_DEPTH or more than MAX_ELEMENTS elements is refused at the element that crosses the line, before the
    rest is allocated, and each element's line is expat's own position (linear time in the file)."""
    if len(text) > MAX_CHARS:
        raise TopoplanError(f"{len(text)} characters: larger than any topology file ({MAX_CHARS} at most); "
                            f"{EXPECTED}", source=source, line=1)
    forbidden = _FORBIDDEN.search(text)
    if forbidden:
        line = text.count("\n", 0, forbidden.start()) + 1
        raise TopoplanError(f"the file declares a {forbidden.group(1).upper()}, which an NCCL topology never does; "
                            "refused (entity expansion)", source=source, line=line)
    parser = expat.ParserCreate()
    stack: list[ET.Element] = []
    lines: dict[ET.Element, int] = {}

    def start(tag: str, attrs: dict[str, str]) -> None:
        line = parser.CurrentLineNumber
        if len(stack) >= MAX_DEPTH:
            raise TopoplanError(f"<{tag}> nested {len(stack) + 1} levels deep; {EXPECTED}, which nests fewer than "
                                f"{MAX_DEPTH}", source=source, line=line)
        if len(lines) >= MAX_ELEMENTS:
            raise TopoplanError(f"more than {MAX_ELEMENTS:,} elements; {EXPECTED} (an 8-GPU dump has ~100)",
                                source=source, line=line)
        element = ET.Element(tag, attrs)
        if stack:
            stack[-1].append(element)
        stack.append(element)
        lines[element] = line

    parser.StartElementHandler = start
    parser.EndElementHandler = lambda tag: stack.pop() if len(stack) > 1 else None  # the root stays
    try:
        parser.Parse(text.lstrip("\ufeff"), True)
    except expat.ExpatError as error:
        raise TopoplanError(f"not well-formed XML ({expat.ErrorString(error.code)}); {EXPECTED}", source=source,
                            line=error.lineno) from None
    return stack[0], lines


def _walk(root: ET.Element, chain: tuple[str, ...], place: _Cpu, devices: list[_Device], seen: dict[str, int],
          lines: dict[ET.Element, int], source: str) -> None:
    """Collect the devices under a <cpu> or <pci>: GPUs, NICs (one per <net>), in document order. A stack, not
    recursion (the depth is bounded by MAX_DEPTH, but no reader recurses on what the input nests); the GPU and
    NIC counts are checked at every device added."""
    todo: list[tuple[ET.Element, tuple[str, ...]]] = [(child, chain) for child in reversed(root)]
    while todo:
        child, chain = todo.pop()
        line, found = lines.get(child, 1), len(devices)
        if child.tag == "pci":
            busid = _busid(child, "busid", line, source)
            if busid in seen:
                raise TopoplanError(f"PCI device {busid} appears twice (first on line {seen[busid]}); expected each "
                                    "bus id once", source=source, line=line)
            seen[busid] = line
            here = (*chain, busid)
            gpu = child.find("gpu")
            cls = child.get("class", "")
            nets = [net for nic in child.findall("nic") for net in nic.findall("net")]
            if gpu is not None or (cls.startswith(GPU_CLASSES) and not len(child)):
                devices.append(_gpu(child, gpu, here, place, lines, source))
            elif nets:
                devices += [_nic(net, busid, here, place, lines, source) for net in nets]
            elif cls.startswith("0x02") and not len(child):
                devices.append(_Device("nic", busid, place, here, line))
            else:
                todo += [(grandchild, here) for grandchild in reversed(child)]
        elif child.tag == "nic":  # a NIC NCCL could not place on the PCI tree (a VM's virtual NIC)
            devices += [_nic(net, None, chain, place, lines, source) for net in child.findall("net")]
        elif child.tag == "gpu":
            raise TopoplanError("<gpu> outside a <pci> element; expected <pci busid=...><gpu .../></pci>",
                                source=source, line=line)
        if len(devices) > found:
            _check_counts(devices, line, source)


def _check_counts(devices: list[_Device], line: int, source: str) -> None:
    gpus = sum(d.kind == "gpu" for d in devices)
    if gpus > MAX_GPUS_PER_NODE or len(devices) - gpus > MAX_NICS_PER_NODE:
        raise TopoplanError(f"more than {MAX_GPUS_PER_NODE} GPUs or {MAX_NICS_PER_NODE} NICs in one file, more than "
                            "one machine holds (docs/limits.md); " + EXPECTED, source=source, line=line)


def _gpu(pci: ET.Element, gpu: ET.Element | None, chain: tuple[str, ...], place: _Cpu,
         lines: dict[ET.Element, int], source: str) -> _Device:
    line = lines.get(pci, 1)
    device = _Device("gpu", chain[-1], place, chain, line,
                     vendor=_VENDORS.get(pci.get("vendor", "").lower()))
    if gpu is None:
        return device
    device.dumped = True
    device.dev = _int_attr(gpu, "dev", lines, source)
    device.sm = gpu.get("sm")
    gcn = gpu.get("gcn") or ""
    device.gcn = gcn if gcn.startswith("gfx") else GCN_NAMES.get(gcn)
    for link in gpu:
        if link.tag in ("nvlink", "xgmi"):
            where = lines.get(link, 1)
            target = link.get("target")
            if not target:
                raise TopoplanError(f"<{link.tag}> without a target; expected target=\"<bus id>\"", source=source,
                                    line=where)
            count = _int_attr(link, "count", lines, source)
            if count is None or count < 1:
                raise TopoplanError(f"<{link.tag} target={target!r}>: expected count=\"<links>\" of at least 1",
                                    source=source, line=where)
            device.fabric.append((link.tag, target.lower(), count, (link.get("tclass") or "").lower(), where))
    return device


def _nic(net: ET.Element, busid: str | None, chain: tuple[str, ...], place: _Cpu,
         lines: dict[ET.Element, int], source: str) -> _Device:
    name = net.get("name")
    if not name:
        raise TopoplanError("<net> without a name; expected name=\"mlx5_0\" (the NIC NCCL uses)", source=source,
                            line=lines.get(net, 1))
    device = _Device("nic", busid, place, chain, lines.get(net, 1), name=name)
    device.dev = _int_attr(net, "dev", lines, source)
    return device


def _fabric_counts(gpus: list[_Device], ids: dict[int, str],
                   notes: list[str]) -> dict[tuple[str, str], tuple[str, str]]:
    """NVLink/XGMI code and evidence per GPU pair: direct links by target bus id, plus links through
    switches (the smaller of the two GPUs' switch-link counts, each GPU's traffic crossing its own)."""
    by_bus = {g.busid: g for g in gpus}
    out: dict[tuple[str, str], tuple[str, str]] = {}
    direct: dict[tuple[int, int], dict[str, int]] = {}
    switch: dict[int, dict[str, int]] = {}
    for i, gpu in enumerate(gpus):
        for tag, target, count, tclass, line in gpu.fabric:
            peer = by_bus.get(target)
            if tclass == SWITCH_CLASS:
                switch.setdefault(i, {}).setdefault(tag, 0)
                switch[i][tag] += count
            elif peer is not None and peer is not gpu:
                j = gpus.index(peer)
                key = (min(i, j), max(i, j))
                direct.setdefault(key, {}).setdefault(tag, 0)
                direct[key][tag] = max(direct[key][tag], count)  # each side lists the same links
            else:
                notes.append(f"line {line}: <{tag} target={target!r}> leads to no GPU in the file; left out")
    for i in range(len(gpus)):
        for j in range(i + 1, len(gpus)):
            for tag in ("nvlink", "xgmi"):
                through = min(switch.get(i, {}).get(tag, 0), switch.get(j, {}).get(tag, 0))
                total = direct.get((i, j), {}).get(tag, 0) + through
                if total:
                    code = f"NV{total}" if tag == "nvlink" else f"XGMI{total}"
                    said = f"{direct.get((i, j), {}).get(tag, 0)} direct" + (f" + {through} through switches"
                                                                               if through else "")
                    out[(ids[id(gpus[i])], ids[id(gpus[j])])] = (code, f"NCCL XML: <{tag}> {said}")
                    break
    return out


def _pci_code(a: _Device, b: _Device) -> tuple[str, str]:
    """NCCL's PCIe path type between two devices, from where they sit in the tree."""
    if a.cpu.index != b.cpu.index:
        return "SYS", f"NCCL XML: different <cpu> (NUMA {a.cpu.numa} and {b.cpu.numa})"
    ca, cb = a.chain[:-1] if a.busid else a.chain, b.chain[:-1] if b.busid else b.chain  # bridges above each
    shared = 0
    while shared < min(len(ca), len(cb)) and ca[shared] == cb[shared]:
        shared += 1
    if shared == 0:
        return "PHB", "NCCL XML: same <cpu>, no shared PCI bridge"
    bridges = (len(ca) - shared) + (len(cb) - shared) + 1
    code = "PIX" if bridges <= 1 else "PXB"
    return code, f"NCCL XML: {bridges} PCI bridge(s) between them, below {ca[shared - 1]}"


def _arch(gpus: list[_Device], notes: list[str]) -> tuple[str | None, str | None]:
    """The GPU generation (`sm80`, or RCCL's `gfx942`) and vendor, when every GPU says the same."""
    archs = {g.gcn or (f"sm{g.sm}" if g.sm else None) for g in gpus} - {None}
    vendors = {g.vendor for g in gpus} - {None}
    if any(g.gcn or g.fabric and g.fabric[0][0] == "xgmi" for g in gpus):
        vendors.add("amd")
    vendor = next(iter(vendors)) if len(vendors) == 1 else None
    if len(archs) > 1:
        notes.append(f"mixed GPU generations ({', '.join(sorted(archs))}): link figures use NCCL's defaults")
        return None, vendor
    arch = next(iter(archs), None)
    if vendor == "amd" and arch is not None and not arch.startswith("gfx"):
        arch = None  # RCCL writes a placeholder sm; the gcn name is the generation
    return arch, vendor or ("nvidia" if arch else None)


def _busid(element: ET.Element, name: str, line: int, source: str) -> str:
    value = element.get(name)
    if value is None or not _BUSID.match(value):
        raise TopoplanError(f"<{element.tag}> {name}={value!r}: expected a PCI bus id such as 0000:1b:00.0",
                            source=source, line=line)
    return value.lower()


def _bus_key(busid: str | None) -> tuple[int, ...]:
    if busid is None:
        return (1 << 40,)
    domain, bus, rest = busid.split(":")
    device, function = rest.split(".")
    return (int(domain, 16), int(bus, 16), int(device, 16), int(function, 16))


def _int_attr(element: ET.Element, name: str, lines: dict[ET.Element, int], source: str,
              allow_negative: bool = False) -> int | None:
    """A whole-number attribute (NCCL writes some in hex, `numaid="0x1"`); None when absent. At most MAX_DIGITS
    digits, checked before converting."""
    value = element.get(name)
    if value is None:
        return None
    text = value.strip().lower()
    hexadecimal = text.lstrip("-").startswith("0x")
    digits = text.replace("0x", "", 1) if hexadecimal else text
    line = lines.get(element, 1)
    if not re.fullmatch(r"-?[0-9a-f]+" if hexadecimal else r"-?[0-9]+", digits) or (
            digits.startswith("-") and not allow_negative):
        raise TopoplanError(f"<{element.tag}> {name}={value!r}: expected a whole number", source=source, line=line)
    return whole_number(digits, f"<{element.tag}> {name}", source=source, line=line, base=16 if hexadecimal else 10)


def _affinity(mask: str | None, line: int, source: str) -> tuple[int, ...] | None:
    """CPUs of a Linux cpumap string (comma-separated 32-bit hex words, most significant first)."""
    if not mask:
        return None
    words = mask.split(",")
    if not all(re.fullmatch(r"[0-9a-fA-F]{1,8}", w) for w in words) or len(words) * 32 > MAX_CPU + 32:
        raise TopoplanError(f"<cpu> affinity={mask!r}: expected a CPU mask such as 00000000,00ffffff",
                            source=source, line=line)
    value = int("".join(w.rjust(8, "0") for w in words), 16)
    cpus = tuple(bit for bit in range(len(words) * 32) if value >> bit & 1)
    return cpus or None
