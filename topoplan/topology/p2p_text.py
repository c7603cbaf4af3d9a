"""Read `nvidia-smi topo -p2p r|w|n|a|p` matrices: per GPU pair, which peer-to-peer modes the driver allows.

nvidia-smi prints the same square matrix for every mode (` \\tGPU0\\tGPU1\\t` header, rows ` GPU0\\tX\\tOK\\t`,
then a legend of statuses) and does not name the mode in its output. A file may hold several matrices;
each takes its mode from the nearest line above it that names one: the command (`nvidia-smi topo -p2p w`,
`--p2pstatus n`) or a title word (read, write, nvlink, atomics, prop). A matrix whose mode nothing
names is recorded under UNKNOWN_MODE, and a note says so, rather than guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from topoplan.errors import TopoplanError
from topoplan.limits import MAX_GPUS_PER_NODE
from topoplan.topology.paste import Line, clean_lines, quote, refuse_markdown_table

MODES = {"r": "read", "w": "write", "n": "nvlink", "a": "atomics", "p": "prop"}
STATUSES = {
    "OK": "Status Ok",
    "CNS": "Chipset not supported",
    "GNS": "GPU not supported",
    "TNS": "Topology not supported",
    "NS": "Not supported",
    "DR": "Disabled by regkey",
    "U": "Unknown",
}
UNKNOWN_MODE = "?"
_COMMAND_MODE = re.compile(r"(?:-p2p|--p2pstatus)[\s=]+([rwnap]+)\b")
_WORD_MODE = re.compile(r"\b(read|write|nvlink|atomics?|prop)\b", re.IGNORECASE)
_WORD_LETTER = {"read": "r", "write": "w", "nvlink": "n", "atomic": "a", "atomics": "a", "prop": "p"}


@dataclass(frozen=True)
class P2pMatrices:
    """Every matrix of one file merged: `statuses[("GPU0", "GPU1")] == {"r": "OK", "w": "CNS"}`."""

    statuses: dict[tuple[str, str], dict[str, str]]
    n_gpus: int
    modes: tuple[str, ...]  # in file order
    notes: tuple[str, ...]
    source: str = "<text>"


def parse_p2p_text(text: str, source: str = "<text>", mode: str | None = None) -> P2pMatrices:
    """Parse one or several `topo -p2p` matrices. `mode` (r, w, n, a, p) applies to a matrix that names
    none. Raises TopoplanError(source, line) on anything that is not a well-formed P2P matrix."""
    if mode is not None and mode not in MODES:
        raise TopoplanError(f"unknown P2P mode {mode!r}; expected one of {', '.join(MODES)}", source=source)
    lines = clean_lines(text, source)
    refuse_markdown_table(lines, source)
    statuses: dict[tuple[str, str], dict[str, str]] = {}
    modes: dict[str, int] = {}
    notes: list[str] = []
    n_gpus = None
    i, context_from = 0, 0
    while i < len(lines):
        words = lines[i].words
        if not words or words[0] != "GPU0" or (len(words) > 1 and not words[1].startswith("GPU")):
            if words and words[0] == "GPU0":
                raise TopoplanError("found P2P row GPU0 with no header line above it; expected the column names "
                                    "(GPU0 GPU1 ...) on the line before", source=source, line=lines[i].number)
            i += 1
            continue
        header = lines[i]
        matrix_mode = _mode_above(lines[context_from:i]) or mode
        if matrix_mode is None:
            matrix_mode = UNKNOWN_MODE
            notes.append(f"line {header.number}: nothing names this P2P matrix's mode (r, w, n, a or p); its statuses "
                         f"are recorded under {UNKNOWN_MODE!r} (put the command, e.g. `nvidia-smi topo -p2p r`, "
                         f"on the line above it)")
        if matrix_mode in modes:
            raise TopoplanError(f"a second P2P matrix for mode {matrix_mode!r} (the first is at line "
                                f"{modes[matrix_mode]}); expected one matrix per mode", source=source,
                                line=header.number)
        modes[matrix_mode] = header.number
        size, i = _read_matrix(lines, i, matrix_mode, statuses, source, notes)
        if n_gpus is not None and size != n_gpus:
            raise TopoplanError(f"this P2P matrix has {size} GPUs but the one above has {n_gpus}; expected "
                                f"matrices of one machine", source=source, line=header.number)
        n_gpus, context_from = size, i
    if n_gpus is None:
        first = next((l for l in lines if not l.blank), None)
        raise TopoplanError(
            "not a `nvidia-smi topo -p2p` matrix: expected a header line GPU0 GPU1 ..."
            + (f", found none (the text begins {quote(first.text)})" if first else ""),
            source=source, line=first.number if first else 1)
    return P2pMatrices(statuses, n_gpus, tuple(modes), tuple(notes), source)


def _mode_above(context: list[Line]) -> str | None:
    """The mode named by the nearest line above a matrix that names exactly one, if any."""
    for line in reversed(context):
        command = _COMMAND_MODE.search(line.text)
        letters = set(command.group(1)) if command else {_WORD_LETTER[w.lower()] for w in _WORD_MODE.findall(line.text)}
        if len(letters) == 1:
            return letters.pop()
        if letters:
            return None  # `-p2p rw` over one matrix names two modes: not ours to pick
    return None


def _read_matrix(lines: list[Line], at: int, mode: str, statuses: dict, source: str,
                 notes: list[str]) -> tuple[int, int]:
    """Read the header at `at` and its rows into `statuses`; return (GPU count, index after the rows)."""
    header = lines[at]
    labels = header.words
    if len(labels) > MAX_GPUS_PER_NODE:
        raise TopoplanError(f"P2P header: {len(labels)} GPUs, more than one machine holds ({MAX_GPUS_PER_NODE}, "
                            "docs/limits.md)", source=source, line=header.number)
    for k, label in enumerate(labels):
        if label != f"GPU{k}":
            raise TopoplanError(f"P2P header: expected GPU{k}, found {quote(label)}", source=source, line=header.number)
    n = len(labels)
    cells: dict[tuple[int, int], tuple[str, Line]] = {}
    i = at + 1
    for row in range(n):
        if i >= len(lines) or lines[i].blank:
            where = lines[i] if i < len(lines) else lines[-1]
            found = "a blank line" if i < len(lines) else "the end of the text"
            raise TopoplanError(f"expected P2P row GPU{row}, found {found}; the matrix looks truncated",
                                source=source, line=where.number)
        line = lines[i]
        words = line.words
        if words[0] != f"GPU{row}":
            raise TopoplanError(f"expected P2P row GPU{row}, found {quote(line.text)}", source=source, line=line.number)
        if len(words) != n + 1:
            raise TopoplanError(f"P2P row GPU{row} has {len(words) - 1} cells, expected {n} (one per GPU)",
                                source=source, line=line.number)
        for col, cell in enumerate(words[1:]):
            expected = "X" if col == row else None
            if (expected and cell != expected) or (not expected and cell not in STATUSES):
                want = "X (the GPU itself)" if expected else f"one of {', '.join(STATUSES)}"
                raise TopoplanError(f"P2P row GPU{row}, column GPU{col}: expected {want}, found {cell!r}",
                                    source=source, line=line.number)
            cells[(row, col)] = (cell, line)
        i += 1
    for a in range(n):
        for b in range(a + 1, n):
            (ab, line_a), (ba, line_b) = cells[(a, b)], cells[(b, a)]
            status = ab
            if ab != ba:
                # The driver answers per direction; a pair is only as usable as its weaker direction.
                status = ba if ab == "OK" else ab
                notes.append(f"lines {line_a.number}/{line_b.number}: P2P mode {mode!r} is {ab} for GPU{a}->GPU{b} "
                             f"but {ba} for GPU{b}->GPU{a}; the pair is recorded as {status}")
            statuses.setdefault((f"GPU{a}", f"GPU{b}"), {})[mode] = status
    return n, i
