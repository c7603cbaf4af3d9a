"""Read AMD's topology text, `rocm-smi --showtopo` and `amd-smi topology`, into a Topology.

Both print square GPU-by-GPU tables; they differ in framing:
- rocm-smi: `==== Weight between two GPUs ====` banners, columns `GPU0 GPU1 ..`, `0` on the diagonal,
  and a `Numa Nodes` block (`GPU[0] : (Topology) Numa Node: 0`; older releases print `GPU 0`).
- amd-smi (ROCm 6.1+): `WEIGHT TABLE:` titles, GPUs named by PCI address (BDF), `SELF` / `0` / `ENABLED` /
  `N/A` on the diagonal, more tables (ACCESS, NUMA BW, ...), a legend; no NUMA placement.

What the tables mean (ROCm MI200 tuning guide, "hardware verification with ROCm"; amd-smi CLI docs): link type
XGMI (Infinity Fabric) or PCIE; hops 1 = XGMI, 2 = PCIe through one CPU socket, 3 = through both sockets;
weight 15 per XGMI hop, 20 per PCIe segment. So PCIe with hops <= 2 is PHB (the tools cannot tell a shared
PCIe switch from the root complex; PHB errs slow), hops 3 is SYS. Neither tool gives XGMI link counts: each
XGMI pair is one link (`XGMI1`). amd-smi's ACCESS table (peer access ENABLED/DISABLED) becomes P2P read/write
status OK/NS. Every link keeps what the tool said about it as evidence.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from topoplan.errors import TopoplanError
from topoplan.limits import MAX_GPUS_PER_NODE, MAX_NUMA_NODE, whole_number
from topoplan.topology.model import Gpu, Topology, build_topology
from topoplan.topology.paste import Line, clean_lines, quote

ROCM_SMI, AMD_SMI = "rocm-smi --showtopo", "amd-smi topology"
_ROCM_BANNER = re.compile(r"^\s*=+\s*(.*?)\s*=+\s*$")
_AMD_TITLE = re.compile(r"^\s*([A-Z][A-Z -]*?)\s+TABLE:\s*$")
_ROCM_LABEL = re.compile(r"^GPU(\d+)$")
_BDF = re.compile(r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
_NUMA = re.compile(r"^\s*GPU\s*\[?(\d+)\]?\s*:\s*\(Topology\)\s*Numa (Node|Affinity)\s*:\s*(-?\d+)\s*$")
_INT = re.compile(r"^\d+$")
WEIGHT_PER_XGMI_HOP = 15  # amd-smi CLI docs: each physical XGMI hop adds 15 to the weight
LINK_TYPES = ("XGMI", "PCIE")
EVIDENCE = ("link type", "weight", "hops", "access", "numa bw")  # the tables a link's evidence quotes


@dataclass
class _Table:
    title: str  # normalised: "weight", "hops", "link type", "access", "numa bw", ...
    line: Line  # the title line
    labels: list[str] = field(default_factory=list)
    rows: dict[str, tuple[Line, list[str]]] = field(default_factory=dict)


def detect_amd_text(text: str, source: str = "<text>") -> str | None:
    """ROCM_SMI or AMD_SMI when the text holds that tool's link-type table, else None."""
    for line in clean_lines(text, source):
        banner = _ROCM_BANNER.match(line.text)
        if banner and banner.group(1).lower() == "link type between two gpus":
            return ROCM_SMI
        if line.text.strip() == "LINK TYPE TABLE:":
            return AMD_SMI
    return None


def parse_rocm_smi_topo(text: str, source: str = "<text>") -> Topology:
    """Parse `rocm-smi --showtopo` (or `--showtopotype/-weight/-hops/-numa`) output."""
    lines = clean_lines(text, source)
    tables, numa, numa_line = _rocm_tables(lines, source)
    return _build(tables, numa, ROCM_SMI, source, numa_line)


def parse_amd_smi_topology(text: str, source: str = "<text>") -> Topology:
    """Parse `amd-smi topology` text output (the table form of ROCm 6.1 and later)."""
    lines = clean_lines(text, source)
    return _build(_amd_tables(lines, source), {}, AMD_SMI, source, 1)


# --- framing ---------------------------------------------------------------------------------------------
def _rocm_tables(lines: list[Line], source: str) -> tuple[dict[str, _Table], dict[int, int | None], int]:
    """The GPU-pair tables, each GPU's NUMA node, and the line of the Numa Nodes banner (1 if none)."""
    tables: dict[str, _Table] = {}
    numa: dict[int, int | None] = {}
    numa_line = 1
    current: _Table | None = None
    in_numa = False
    for line in lines:
        if line.blank:
            continue
        banner = _ROCM_BANNER.match(line.text)
        if banner:
            title = banner.group(1).lower()
            current, in_numa = None, title == "numa nodes"
            numa_line = line.number if in_numa else numa_line
            if title.endswith(" between two gpus"):
                current = _start(tables, title.removesuffix(" between two gpus"), line, source)
            continue
        if in_numa:
            match = _NUMA.match(line.text)
            if not match:
                raise TopoplanError(f"Numa Nodes block: expected 'GPU[<n>] : (Topology) Numa Node: <node>', found "
                                    f"{quote(line.text)}", source=source, line=line.number)
            if match.group(2) == "Node":
                gpu = whole_number(match.group(1), "Numa Nodes block, GPU", source=source, line=line.number)
                node = whole_number(match.group(3), "Numa Nodes block, node", source=source, line=line.number)
                if node > MAX_NUMA_NODE or gpu >= MAX_GPUS_PER_NODE:
                    raise TopoplanError(f"Numa Nodes block: GPU {gpu} on node {node}; expected GPUs 0 to "
                                        f"{MAX_GPUS_PER_NODE - 1} and nodes 0 to {MAX_NUMA_NODE}", source=source,
                                        line=line.number)
                numa[gpu] = node if node >= 0 else None
        elif current is not None:
            _add_row(current, line, source, _rocm_label)
    return tables, numa, numa_line


def _amd_tables(lines: list[Line], source: str) -> dict[str, _Table]:
    tables: dict[str, _Table] = {}
    current: _Table | None = None
    for line in lines:
        if line.blank:
            continue
        if line.text.strip().startswith("Legend:"):
            break  # the legend explains the letters; it holds no data
        title = _AMD_TITLE.match(line.text)
        if title:
            current = _start(tables, title.group(1).lower(), line, source)
        elif current is not None:
            _add_row(current, line, source, _amd_label)
    return tables


def _start(tables: dict[str, _Table], title: str, line: Line, source: str) -> _Table:
    if title in tables:
        raise TopoplanError(f"a second {title!r} table (the first is on line {tables[title].line.number}); "
                            "expected one output of one machine", source=source, line=line.number)
    tables[title] = _Table(title, line)
    return tables[title]


def _rocm_label(word: str) -> bool:
    return bool(_ROCM_LABEL.match(word))


def _amd_label(word: str) -> bool:
    return bool(_BDF.match(word))


def _add_row(table: _Table, line: Line, source: str, is_label: Callable[[str], bool]) -> None:
    """The column header (only labels), then rows (a label, then one cell per column)."""
    words = line.words
    if not table.labels:
        if not all(is_label(w) for w in words):
            raise TopoplanError(f"{table.title!r} table: expected a header of GPU names, found {quote(line.text)}",
                                source=source, line=line.number)
        if len(words) > MAX_GPUS_PER_NODE:
            raise TopoplanError(f"{table.title!r} table: {len(words)} GPUs in the header, more than one machine "
                                f"holds ({MAX_GPUS_PER_NODE}, docs/limits.md)", source=source, line=line.number)
        if len(set(words)) != len(words):
            raise TopoplanError(f"{table.title!r} table: a GPU is named twice in the header", source=source,
                                line=line.number)
        table.labels = words
        return
    label, cells = words[0], words[1:]
    expected = table.labels[len(table.rows)] if len(table.rows) < len(table.labels) else None
    if label != expected:
        want = f"row {expected}" if expected else "no more rows"
        raise TopoplanError(f"{table.title!r} table: expected {want} (the header names {len(table.labels)} GPUs), "
                            f"found {quote(line.text)}", source=source, line=line.number)
    if len(cells) != len(table.labels):
        raise TopoplanError(f"{table.title!r} table, row {label}: {len(cells)} cells, expected {len(table.labels)} "
                            f"(one per column {table.labels[0]}..{table.labels[-1]}); the row looks damaged",
                            source=source, line=line.number)
    table.rows[label] = (line, cells)


# --- meaning ----------------------------------------------------------------------------------------------
def _build(tables: dict[str, _Table], numa: dict[int, int | None], tool: str, source: str,
           numa_line: int) -> Topology:
    link_table = tables.get("link type")
    if link_table is None:
        raise TopoplanError(f"no link type table: expected the output of `{tool}` (its 'Link Type' table names "
                            "XGMI or PCIE for every GPU pair)", source=source, line=1)
    labels = link_table.labels
    for table in tables.values():
        if not table.labels:
            raise TopoplanError(f"{table.title!r} table is empty: expected a header of GPU names and one row per "
                                "GPU; the output looks truncated", source=source, line=table.line.number)
        if table.labels != labels:
            raise TopoplanError(f"{table.title!r} table names GPUs {' '.join(table.labels)}, the link type table "
                                f"{' '.join(labels)}; expected the same GPUs in every table", source=source,
                                line=table.line.number)
        if len(table.rows) < len(labels):
            missing = labels[len(table.rows)]
            raise TopoplanError(f"{table.title!r} table has no row {missing}: the output looks truncated",
                                source=source, line=table.line.number)
    n = len(labels)
    cell = {title: [table.rows[label][1] for label in table.labels] for title, table in tables.items()}
    for title, diagonal in (("link type", ("0", "SELF")), ("weight", ("0",)), ("hops", ("0",)),
                            ("access", ("ENABLED",))):
        if title in cell:
            _check_matrix(tables[title], cell[title], diagonal, source)
    notes: list[str] = []
    codes: dict[tuple[str, str], str] = {}
    evidence: dict[tuple[str, str], str] = {}
    p2p: dict[tuple[str, str], dict[str, str]] = {}
    for a in range(n):
        for b in range(a + 1, n):
            pair = (f"GPU{a}", f"GPU{b}")
            said = {title: values[a][b] for title, values in cell.items()}
            codes[pair] = _code(said, tables, a, b, source, notes)
            evidence[pair] = f"{tool}: " + ", ".join(f"{t} {v}" for t, v in said.items() if t in EVIDENCE)
            if "access" in said:
                status = "OK" if said["access"] == "ENABLED" else "NS"
                p2p[pair] = {"r": status, "w": status}
    gpus = [Gpu(f"GPU{i}", i, pci_bus_id=label if _BDF.match(label) else None, numa_node=numa.get(i))
            for i, label in enumerate(labels)]
    if numa and set(numa) != set(range(n)):
        raise TopoplanError(f"the Numa Nodes block names GPUs {sorted(numa)}, the tables {n} GPUs (0..{n - 1}); "
                            "expected one entry per GPU", source=source, line=numa_line)
    return build_topology(gpus, [], codes, p2p=p2p, source=source, notes=notes, evidence=evidence, vendor="amd")


def _check_matrix(table: _Table, values: list[list[str]], diagonal: tuple[str, ...], source: str) -> None:
    """The diagonal is the tool's self marker and each pair reads the same both ways."""
    n = len(values)
    for a in range(n):
        line = table.rows[table.labels[a]][0]
        if values[a][a] not in diagonal:
            raise TopoplanError(f"{table.title!r} table, row {table.labels[a]}: expected {' or '.join(diagonal)} on "
                                f"the diagonal, found {values[a][a]!r}", source=source, line=line.number)
        for b in range(a):
            if values[a][b] != values[b][a]:
                raise TopoplanError(f"{table.title!r} table is not symmetric: {table.labels[a]}-{table.labels[b]} "
                                    f"is {values[a][b]!r} here but {values[b][a]!r} in row {table.labels[b]}",
                                    source=source, line=line.number)


def _number(table: _Table, value: str, a: int, source: str) -> int:
    if not _INT.match(value):
        raise TopoplanError(f"{table.title!r} table, row {table.labels[a]}: expected a whole number, found "
                            f"{value!r}", source=source, line=table.rows[table.labels[a]][0].number)
    return whole_number(value, f"{table.title!r} table, row {table.labels[a]}", source=source,
                        line=table.rows[table.labels[a]][0].number)


def _code(said: dict[str, str], tables: dict[str, _Table], a: int, b: int, source: str, notes: list[str]) -> str:
    """The link code of one GPU pair from its link type, hops and weight."""
    table = tables["link type"]
    kind = said["link type"]
    if kind not in LINK_TYPES:
        raise TopoplanError(f"'link type' table, row {table.labels[a]}: unknown link type {kind!r} to "
                            f"{table.labels[b]}; expected {' or '.join(LINK_TYPES)}", source=source,
                            line=table.rows[table.labels[a]][0].number)
    hops = _number(tables["hops"], said["hops"], a, source) if "hops" in said else None
    weight = _number(tables["weight"], said["weight"], a, source) if "weight" in said else None
    if kind == "XGMI":
        if weight is not None and weight > WEIGHT_PER_XGMI_HOP:
            notes.append(f"GPU{a}-GPU{b}: XGMI weight {weight} means {weight // WEIGHT_PER_XGMI_HOP} XGMI hops "
                         "(through another GPU); priced as one link")
        return "XGMI"
    if hops is not None:
        return "PHB" if hops <= 2 else "SYS"
    if weight is not None:
        return "PHB" if weight <= 40 else "SYS"
    notes.append(f"GPU{a}-GPU{b}: PCIE with neither hops nor weight given; shown as SYS (the farthest)")
    return "SYS"
