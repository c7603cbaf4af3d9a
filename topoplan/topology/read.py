"""Read a topology from a file (or stdin): the one entry point for `topoplan inspect --file` and the planner.
It reads `nvidia-smi topo -m` text, topoplan NVML recordings, NCCL topology XML, `rocm-smi --showtopo` and
`amd-smi topology` text, telling them apart by content.

Bytes are checked before parsing, so an empty file, binary junk or a wrong encoding gets its own clear
message instead of a confusing parse error. Format detection lives in `detect_format` alone.
"""

from __future__ import annotations

import re
import sys

from topoplan.errors import TopoplanError
from topoplan.jsonfile import parse_json
from topoplan.limits import read_capped
from topoplan.topology.amd_text import ROCM_SMI, detect_amd_text, parse_amd_smi_topology, parse_rocm_smi_topo
from topoplan.topology.model import Topology, build_topology
from topoplan.topology.nccl_xml import looks_like_nccl_xml, parse_nccl_xml
from topoplan.topology.p2p_text import P2pMatrices, parse_p2p_text
from topoplan.topology.recording import FORMAT as RECORDING_FORMAT
from topoplan.topology.recording import parse_recording, topology_from_recording
from topoplan.topology.smi_text import parse_topo_text

STDIN = "-"
_EXPECTED = "expected the text output of `nvidia-smi topo -m`"
_EXPECTED_P2P = "expected the text output of `nvidia-smi topo -p2p r|w|n|a|p`"
# Control bytes other than whitespace and the ESC of nvidia-smi's underlined header: binary data, not a paste.
_BINARY = re.compile("[\x00-\x08\x0e-\x1a\x1c-\x1f\x7f]")
READERS = {"nccl-xml": parse_nccl_xml, "rocm-smi": parse_rocm_smi_topo, "amd-smi": parse_amd_smi_topology}


def read_topology(path: str, p2p_path: str | None = None) -> Topology:
    """Parse the topology in `path` (`-` for stdin), with `nvidia-smi topo -p2p` statuses from `p2p_path`."""
    source = _display(path)
    text = read_text(path)
    fmt = detect_format(text, source)
    if fmt == "recording":
        if p2p_path is not None:
            raise TopoplanError("--p2p goes with `topo -m` text; a recording holds NVML's P2P statuses already",
                                source=_display(p2p_path))
        return topology_from_recording(parse_recording(text, source), source)
    if fmt in READERS and p2p_path is not None:
        raise TopoplanError(f"--p2p goes with `topo -m` text, not with a {fmt} file", source=_display(p2p_path))
    if fmt in READERS:
        return READERS[fmt](text, source)
    if fmt != "smi-text":
        raise TopoplanError(f'JSON, but not a topoplan NVML recording (no "format": "{RECORDING_FORMAT}"); '
                            f"{_EXPECTED} or a recording written by `topoplan inspect --save`", source=source, line=1)
    topology = parse_topo_text(text, source=source)
    if p2p_path is None:
        return topology
    return attach_p2p(topology, parse_p2p_text(read_text(p2p_path, _EXPECTED_P2P), source=_display(p2p_path)))


def detect_format(text: str, source: str = "<input>") -> str:
    """What kind of topology file this is, by content: "nccl-xml" (a document whose root is <system>),
    "rocm-smi" / "amd-smi" (their link-type tables), "smi-text" (`nvidia-smi topo -m`), "recording" (a topoplan
    NVML recording, or any text opening with `{` that is not JSON: `topo -m` never does, and a damaged recording
    should get the JSON error), or "other JSON"."""
    if looks_like_nccl_xml(text):
        return "nccl-xml"
    start = text.lstrip()[:1]
    if start in ("{", "["):  # JSON before AMD text, whose reader counts lines (a recording may have thousands)
        try:
            data = parse_json(text, "<input>", "JSON")
        except TopoplanError:  # bad, too deep or too large JSON: the reader chosen here words the error
            if start == "{":
                return "recording"
        else:
            return "recording" if isinstance(data, dict) and data.get("format") == RECORDING_FORMAT else "other JSON"
    amd = detect_amd_text(text, source)  # a bare `[4m` (an ANSI leftover) also starts with "["
    if amd is not None:
        return "rocm-smi" if amd == ROCM_SMI else "amd-smi"
    return "smi-text"


def attach_p2p(topology: Topology, p2p: P2pMatrices) -> Topology:
    """The same topology with P2P statuses on its GPU pairs (the p2p file must describe the same GPUs)."""
    if p2p.n_gpus != len(topology.gpus):
        raise TopoplanError(f"the P2P matrix has {p2p.n_gpus} GPUs but the topology ({topology.source}) has "
                            f"{len(topology.gpus)}; expected both from the same machine", source=p2p.source)
    links = topology.links()
    return build_topology(topology.gpus, topology.nics, {(l.a, l.b): l.code for l in links}, arch=topology.arch,
                          gpu_name=topology.gpu_name, p2p=p2p.statuses, source=topology.source,
                          notes=(*topology.notes, *(f"{p2p.source}: {note}" for note in p2p.notes)),
                          evidence={(l.a, l.b): l.evidence for l in links if l.evidence}, vendor=topology.vendor)


def read_text(path: str, expected: str = _EXPECTED) -> str:
    """The file's text, refusing what cannot be a paste: nothing, binary data, an unknown encoding.
    `expected` ends each message: what the file should have held."""
    source = _display(path)
    try:
        data = read_capped(source, sys.stdin.buffer) if path == STDIN else read_capped(path)
    except OSError as error:
        raise TopoplanError(f"cannot read it: {error.strerror or error}", source=source) from None
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):  # UTF-16, as PowerShell's `>` writes it
        text = data.decode("utf-16", errors="replace")
    else:
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as error:
            raise TopoplanError(f"not UTF-8 text (byte 0x{data[error.start]:02x}); {expected}",
                                source=source, line=data.count(b"\n", 0, error.start) + 1) from None
    if not text.strip():
        raise TopoplanError(f"the file is empty; {expected}", source=source, line=1)
    bad = _BINARY.search(text)
    if bad is not None:
        raise TopoplanError(f"binary data (control byte 0x{ord(bad.group(0)):02x}), not text; {expected}",
                            source=source, line=text.count("\n", 0, bad.start()) + 1)
    return text


def _display(path: str) -> str:
    return "<stdin>" if path == STDIN else path
