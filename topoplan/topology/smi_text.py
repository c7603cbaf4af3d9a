"""Read the text of `nvidia-smi topo -m` (or `-mp`) into a Topology, as it really arrives: pasted.

What the reader copes with, and why each is certain rather than guessed:
- tabs kept or expanded to spaces: fields are rebuilt from 8-column tab stops (paste.tab_fields);
  nvidia-smi writes `cpu<TAB>numa<TAB><TAB>gpu_numa`, keeps an empty CPU field and puts an extra tab
  before an `N/A` NUMA value, so the trailing values sit at tab stops, not under their header labels;
- rows re-padded by hand or with tabs turned into single spaces: link cells never contain spaces, so
  they are read word by word; the trailing values too, when one is given per trailing column;
- ANSI underline codes (or their `[4m` leftovers), indentation, CRLF, a missing legend, NIC columns
  named `NIC<k>` (names in the `NIC Legend:` block) or directly `mlx5_<k>`, the old `SOC` code,
  NIC rows present or left out, a header that lost its empty corner cell, cells fused by a lost tab.
Anything recovered from damage is written to Topology.notes; anything uncertain is a TopoplanError
naming the file, the line and what was expected.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from topoplan.cpuset import parse_cpu_list
from topoplan.errors import TopoplanError
from topoplan.limits import MAX_GPUS_PER_NODE, MAX_NICS_PER_NODE, MAX_NUMA_NODE
from topoplan.topology.links import parse_link_code
from topoplan.topology.model import Gpu, Nic, Topology, build_topology
from topoplan.topology.p2p_text import STATUSES as P2P_STATUSES
from topoplan.topology.paste import Line, clean_lines, join_lines, quote, refuse_markdown_table, tab_fields

# Trailing columns, in the order every driver prints the ones it has.
CPU, NUMA, GPU_NUMA = "CPU Affinity", "NUMA Affinity", "GPU NUMA ID"
TRAILING = (CPU, NUMA, GPU_NUMA)
_TRAILING_WORDS = [(CPU, ("CPU", "Affinity")), (NUMA, ("NUMA", "Affinity")), (GPU_NUMA, ("GPU", "NUMA", "ID"))]
_GPU_LABEL = re.compile(r"^GPU\d+$")
_NIC_LABEL = re.compile(r"^NIC\d+$")
_DEVICE_LABEL = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")
_NUMBER = re.compile(r"[0-9]{1,9}")
_CODE_RUN = re.compile(r"NV\d+|PIX|PXB|PHB|NODE|SYS|SOC")
_CELL = re.compile(r"^(X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC|N/A|[0-9][0-9,-]*)$")
_LEGEND_NIC = re.compile(r"^\s*NIC(\d{1,6})\s*:\s*(\S+)\s*$")
EXPECTED_CODES = "X, NV<n>, PIX, PXB, PHB, NODE, SYS (or the old SOC)"


@dataclass
class _Header:
    line: Line
    devices: list[str]  # column labels as printed: GPU0.., then NIC0.. or mlx5_0..
    trailing: list[str]  # the subset of CPU, NUMA, GPU_NUMA this driver prints, in order
    n_gpus: int


class _Notes(list):
    """What the reader recovered, in order, each said once."""

    def __init__(self) -> None:
        super().__init__()
        self.off_grid: list[Line] = []  # GPU rows whose trailing values were read word by word

    def add(self, note: str) -> None:
        if note not in self:
            self.append(note)


def parse_topo_text(text: str, source: str = "<text>") -> Topology:
    """Parse one `nvidia-smi topo -m` / `-mp` paste. Raises TopoplanError(source, line) on bad input."""
    lines = clean_lines(text, source)
    refuse_markdown_table(lines, source)
    notes = _Notes()
    header_at = _find_header(lines, source)
    header = _parse_header(lines[header_at], source)
    rows, codes, gpus = _read_matrix(lines, header_at, header, source, notes)
    after = max(line.last for line in rows.values())  # index of the first line after the matrix
    _refuse_trailing_matrix(lines[after:], header, source)
    if header.line.indent <= rows["GPU0"].indent:
        notes.add(f"line {header.line.number}: the header lost its empty corner cell (its first column name "
                  f"starts where the row labels do); column names were matched to cells by order")
    nic_labels = header.devices[header.n_gpus:]
    if nic_labels and not any(label in rows for label in nic_labels):
        notes.add("the paste has no NIC rows: GPU-NIC links come from the GPU rows alone (not cross-checked "
                  "against a NIC row) and NIC-NIC links are unknown")
    nics = _nics(nic_labels, lines[after:], notes)
    if _pcie_only_view(lines[:header_at], lines[after:]):
        notes.add(NVLINK_HIDDEN)
    if notes.off_grid:
        first, last = notes.off_grid[0], notes.off_grid[-1]
        span = f"line {first.number}" if first is last else f"lines {first.number}-{last.number}"
        notes.add(f"{span}: {len(notes.off_grid)} GPU row(s) not aligned to 8-column tab stops (re-padded or "
                  f"tabs lost); each row has one value per trailing column, so they were read in order")
    return build_topology(gpus, nics, codes, source=source, notes=notes, vendor="nvidia")


def _read_matrix(lines: list[Line], header_at: int, header: _Header, source: str,
                 notes: _Notes) -> tuple[dict[str, Line], dict[tuple[str, str], str], list[Gpu]]:
    """Read and check every row: each cell a known code, X on the diagonal, each pair the same both ways."""
    ids = {label: (f"GPU{i}" if i < header.n_gpus else f"NIC{i - header.n_gpus}")
           for i, label in enumerate(header.devices)}
    codes: dict[tuple[str, str], str] = {}
    seen: dict[tuple[str, str], tuple[str, Line]] = {}
    gpus: list[Gpu] = []
    rows: dict[str, Line] = {}  # label -> line, in header order
    for label, line in _read_rows(lines, header_at, header, source, notes):  # checked in line order
        rows[label] = line
        cells, trailing = _split_row(line, header, label, source, notes)
        for column, cell in zip(header.devices, cells):
            _check_cell(label, column, cell, line, source)
            if column == label:
                continue
            normal = parse_link_code(cell)[0]
            mirror = seen.get((column, label))
            if mirror and mirror[0] != normal:
                raise TopoplanError(
                    f"the matrix is not symmetric: row {label} says {label}-{column} is {cell}, but row {column} "
                    f"(line {mirror[1].number}) says {mirror[0]}; expected the same code both ways",
                    source=source, line=line.number)
            seen[(label, column)] = (normal, line)
            codes[(ids[label], ids[column])] = cell
        if header.devices.index(label) < header.n_gpus:
            gpus.append(_gpu(len(gpus), trailing, header, line, source))
        elif any(trailing):
            raise TopoplanError(f"row {label} has values after its {len(header.devices)} link cells "
                                f"({quote(' '.join(t for t in trailing if t))}); expected none in a NIC row",
                                source=source, line=line.number)
    return rows, codes, gpus


# --- header ------------------------------------------------------------------------------------------
def _find_header(lines: list[Line], source: str) -> int:
    """Index of the column-name line: the first line whose first word is GPU0 and that holds only names."""
    for i, line in enumerate(lines):
        words = line.words
        if not words or words[0] != "GPU0":
            continue
        if len(words) > 1 and (words[1] == "X" or parse_link_code(words[1]) or words[1] in P2P_STATUSES):
            raise TopoplanError("found matrix row GPU0 with no header line above it; expected the column names "
                                "(GPU0 GPU1 ... CPU Affinity ...) on the line before", source=source, line=line.number)
        return i
    first = next((l for l in lines if not l.blank), None)
    raise TopoplanError(
        "not a `nvidia-smi topo -m` matrix: expected a header line of column names starting with GPU0"
        + (f", found none (the text begins {quote(first.text)})" if first else ""),
        source=source, line=first.number if first else 1)


def _parse_header(line: Line, source: str) -> _Header:
    words, devices, trailing = line.words, [], []
    i = 0
    while i < len(words):
        for name, seq in _TRAILING_WORDS:
            if tuple(words[i:i + len(seq)]) == seq:
                if trailing and TRAILING.index(name) <= TRAILING.index(trailing[-1]):
                    raise TopoplanError(f"header: column {name!r} repeated or out of order; expected "
                                        f"{CPU!r}, {NUMA!r}, {GPU_NUMA!r} in that order", source=source,
                                        line=line.number)
                trailing.append(name)
                i += len(seq)
                break
        else:
            word = words[i]
            if trailing or not _DEVICE_LABEL.match(word):
                raise TopoplanError(f"header: unexpected column name {quote(word)}; expected device names (GPU0.., "
                                    f"NIC0.. or mlx5_0..) followed by {CPU!r}, {NUMA!r}, {GPU_NUMA!r}",
                                    source=source, line=line.number)
            devices.append(word)
            i += 1
    n_gpus = 0
    while n_gpus < len(devices) and devices[n_gpus] == f"GPU{n_gpus}":
        n_gpus += 1
    for k, label in enumerate(devices[n_gpus:]):
        if _GPU_LABEL.match(label) or (_NIC_LABEL.match(label) and label != f"NIC{k}"):
            expected = f"GPU{n_gpus} or NIC{k}" if k == 0 else f"NIC{k}"
            raise TopoplanError(f"header: column {label!r} out of order; expected {expected} there",
                                source=source, line=line.number)
    if len(set(devices)) != len(devices):
        raise TopoplanError("header: a device column is named twice", source=source, line=line.number)
    if n_gpus > MAX_GPUS_PER_NODE or len(devices) - n_gpus > MAX_NICS_PER_NODE:
        raise TopoplanError(f"{n_gpus} GPUs and {len(devices) - n_gpus} NICs in one matrix; one node has at most "
                            f"{MAX_GPUS_PER_NODE} GPUs and {MAX_NICS_PER_NODE} NICs (docs/limits.md)",
                            source=source, line=line.number)
    return _Header(line, devices, trailing, n_gpus)


# --- rows --------------------------------------------------------------------------------------------
def _read_rows(lines: list[Line], header_at: int, header: _Header, source: str,
               notes: _Notes) -> Iterator[tuple[str, Line]]:
    """The matrix rows with their labels: every GPU row, then every NIC row or none (some pastes drop them)."""
    i = header_at + 1
    for k, label in enumerate(header.devices):
        j = i
        while j < len(lines) and lines[j].blank:
            j += 1
        found = lines[j] if j < len(lines) else None
        if found is not None and found.words[0] == label:
            if j > i and k > 0:
                notes.add(f"line {lines[i].number}: blank line between matrix rows ignored")
            i = j + 1
            wanted = 1 + len(header.devices) + (len(header.trailing) if k < header.n_gpus else 0)
            while len(found.words) < wanted and i < len(lines) and _continues_row(lines[i]):
                i += 1
            if i > j + 1:
                found = join_lines(lines[j:i])
                notes.add(f"line {found.number}: row {label} was wrapped over lines {found.number}-"
                          f"{lines[i - 1].number}; joined, its cells read in order")
            yield label, found
            continue
        if k == header.n_gpus:  # the GPU rows are complete and no NIC rows follow
            break
        if found is None:
            last = lines[-1].number
            raise TopoplanError(f"expected row {label} after this line, found the end of the text; "
                                f"the paste looks truncated", source=source, line=last)
        raise TopoplanError(f"expected row {label} (the header names {len(header.devices)} devices), "
                            f"found {quote(found.text)}", source=source, line=found.number)


def _continues_row(line: Line) -> bool:
    """Whether a line can be the wrapped tail of a row: nothing but cells (codes, CPU lists, numbers, N/A)."""
    return not line.blank and all(_CELL.match(word) for word in line.words)


def _split_row(line: Line, header: _Header, label: str, source: str, notes: _Notes) -> tuple[list[str], list[str]]:
    """The link cells of a row, and its trailing fields (with empty fields kept when the row is on the
    tab grid, so an empty CPU field stays empty)."""
    n = len(header.devices)
    words = _unfuse(line.words, n, line, notes)
    if len(words) < 1 + n:
        raise TopoplanError(f"row {label} has {len(words) - 1} cells, expected {n} (one per column "
                            f"{header.devices[0]}..{header.devices[-1]}); the row looks truncated or damaged",
                            source=source, line=line.number)
    fields = tab_fields(line)
    if fields[:1 + n] == words[:1 + n] and not line.joined:
        return words[1:1 + n], fields[1 + n:]
    if len(words) > 1 + n and not line.joined:
        notes.off_grid.append(line)
    return words[1:1 + n], words[1 + n:]


def _unfuse(words: list[str], n: int, line: Line, notes: _Notes) -> list[str]:
    """Split link cells fused by a lost tab (`NV12NV12`) when the pieces are unambiguous codes."""
    out = list(words)
    for i in range(1, min(len(out), 1 + n)):
        cell = out[i]
        if parse_link_code(cell) or cell == "X":
            continue
        pieces = _CODE_RUN.findall(cell)
        if len(pieces) > 1 and "".join(pieces) == cell:
            notes.add(f"line {line.number}: cell {cell!r} split into {' '.join(pieces)} (a tab was lost)")
            out[i:i + 1] = pieces
    return out


def _check_cell(row: str, column: str, cell: str, line: Line, source: str) -> None:
    if column == row:
        if cell != "X":
            raise TopoplanError(f"row {row}, column {column}: expected X (the device itself), found {cell!r}",
                                source=source, line=line.number)
        return
    if parse_link_code(cell):
        return
    if cell in P2P_STATUSES:
        raise TopoplanError(f"row {row}, column {column}: {cell!r} is a `nvidia-smi topo -p2p` status, not a link "
                            f"code; this looks like a P2P matrix (pass it with --p2p), expected `topo -m` output",
                            source=source, line=line.number)
    where = "X off the diagonal" if cell == "X" else f"unknown link code {cell!r}"
    raise TopoplanError(f"row {row}, column {column}: {where}; expected one of {EXPECTED_CODES}",
                        source=source, line=line.number)


# --- GPU affinity values ------------------------------------------------------------------------------
def _gpu(index: int, trailing: list[str], header: _Header, line: Line, source: str) -> Gpu:
    """A GPU from its row's trailing fields: the first is always the CPU list (empty = unknown); the NUMA
    values follow, with nvidia-smi's padding tabs (empty fields) skipped."""
    values = dict.fromkeys(header.trailing, "")
    rest = list(trailing)
    if CPU in values:
        values[CPU] = rest.pop(0) if rest else ""
    others = [v for v in rest if v]
    wanted = [c for c in header.trailing if c != CPU]
    if len(others) != len(wanted) or (CPU in values and not values[CPU] and not trailing):
        got = " ".join(t for t in trailing if t) or "nothing"
        expected = ", ".join(header.trailing) or "nothing"
        raise TopoplanError(f"row GPU{index}: expected values for {expected} after the link cells, found {quote(got)}",
                            source=source, line=line.number)
    values.update(zip(wanted, others))

    def number(column: str) -> int | None:
        value = values.get(column, "")
        if value in ("", "N/A"):
            return None
        if not _NUMBER.fullmatch(value) or int(value) > MAX_NUMA_NODE:  # a larger one is damage
            raise TopoplanError(f"row GPU{index}, {column}: expected a NUMA node number or N/A, found {value!r}",
                                source=source, line=line.number)
        return int(value)

    return Gpu(f"GPU{index}", index, cpus=_cpus(values.get(CPU, ""), index, line, source),
               numa_node=number(NUMA), gpu_numa_id=number(GPU_NUMA))


def _cpus(text: str, index: int, line: Line, source: str) -> tuple[int, ...] | None:
    if text in ("", "N/A"):
        return None
    try:
        return parse_cpu_list(text)
    except ValueError:
        raise TopoplanError(f"row GPU{index}, {CPU}: expected a CPU list such as 0-15,32-47 or N/A, found {text!r}",
                            source=source, line=line.number) from None


# --- after the matrix ---------------------------------------------------------------------------------
def _refuse_trailing_matrix(rest: list[Line], header: _Header, source: str) -> None:
    """A second matrix, or a row the header doesn't name, means the paste isn't one clean matrix."""
    for line in rest:
        words = line.words
        if not words:
            continue
        if words[0] == "GPU0" and line is not header.line:
            raise TopoplanError("a second matrix starts here; expected one `nvidia-smi topo -m` matrix per file "
                                "(a `topo -p2p` matrix goes in its own file, passed with --p2p)",
                                source=source, line=line.number)
        if len(words) > 1 and _DEVICE_LABEL.match(words[0]) and (words[1] == "X" or parse_link_code(words[1])):
            raise TopoplanError(f"row {words[0]!r} is not a column of the header (line {header.line.number}); "
                                f"expected the legend or the end of the matrix", source=source, line=line.number)


# `nvidia-smi topo -mp` (`--matrix_pci`) prints the PCIe path between every pair, NVLinked or not, and its
# legend has no `NV#` line. Planned as it stands, an NVLink box looks like a PCIe box: say so.
NVLINK_HIDDEN = ("NVLink not shown: this is a `nvidia-smi topo -mp` (PCIe-only) view, so GPUs joined by NVLink are "
                 "priced as PCIe; paste `nvidia-smi topo -m` to see NVLink")
_MP_COMMAND = re.compile(r"\btopo\s+(?:-\w*\s+)*(?:-mp|--matrix_pci)\b")
_LEGEND_CODE = re.compile(r"^\s*(NV#|PIX)\s*=")


def _pcie_only_view(before: list[Line], after: list[Line]) -> bool:
    """The paste is a `topo -mp` matrix: its command line says so, or its legend lists PCIe codes but no NV#."""
    if any(_MP_COMMAND.search(line.text) for line in before):
        return True
    codes = {match.group(1) for line in after if (match := _LEGEND_CODE.match(line.text))}
    return codes == {"PIX"}


def _nics(labels: list[str], rest: list[Line], notes: _Notes) -> list[Nic]:
    """NICs in column order; the name is the header's own (`mlx5_0`) or the NIC Legend's, else None."""
    legend = {}
    for line in rest:
        match = _LEGEND_NIC.match(line.text)
        if match:
            legend[int(match.group(1))] = match.group(2)
    generic = [k for k, label in enumerate(labels) if _NIC_LABEL.match(label)]
    named = [k for k in generic if k in legend]
    if legend and generic and len(named) < len(generic):
        notes.add(f"the NIC Legend names {len(named)} of the {len(generic)} NICs; the others have no name")
    return [Nic(f"NIC{k}", k, legend.get(k) if _NIC_LABEL.match(label) else label) for k, label in enumerate(labels)]
