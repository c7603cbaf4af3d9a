"""Renderers of a topology, one module per format; `emit` picks one and writes to stdout or a file.

Each renderer is imported only when chosen, so `--json` never loads rich tables.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from topoplan.errors import TopoplanError
from topoplan.topology.model import Topology

FORMATS = ("table", "json", "dot", "mermaid", "svg", "png", "nccl-xml")
IMAGE_FORMATS = ("svg", "png")
# Width for the table when stdout is not a terminal (a pipe, a file): wide enough for 8 GPUs x 18 NICs.
PIPE_WIDTH = 200

if TYPE_CHECKING:
    from rich.console import Group


def _text(topo: Topology, fmt: str) -> str:
    from topoplan.topology.diagnose import diagnose

    if fmt == "json":
        from topoplan.topology.export import dumps, topology_dict

        return dumps(topology_dict(topo, diagnose(topo)))
    if fmt == "dot":
        from topoplan.topology.render.dot import render_dot

        return render_dot(topo)
    if fmt == "mermaid":
        from topoplan.topology.render.mermaid import render_mermaid

        return render_mermaid(topo)
    raise ValueError(fmt)


def _table_view(topo: Topology) -> Group:
    from topoplan.topology.diagnose import diagnose
    from topoplan.topology.render.table import render_table

    return render_table(topo, diagnose(topo))


def _print_table(topo: Topology) -> None:
    """The table on stdout: coloured on a terminal, PIPE_WIDTH wide into a pipe unless COLUMNS says."""
    import os

    from rich.console import Console

    from topoplan.terminal import emit

    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = PIPE_WIDTH
    emit(console, _table_view(topo))


def _plain_table(topo: Topology) -> str:
    """The table as plain text without colour codes, for a file."""
    import io

    from rich.console import Console

    buffer = io.StringIO()
    Console(file=buffer, width=PIPE_WIDTH, color_system=None).print(_table_view(topo))
    return buffer.getvalue()


def _nccl_xml(topo: Topology, allow_invented_bus_ids: bool) -> str:
    """The NCCL XML (topoplan.topology.nccl_xml_write), each thing it made up said on stderr."""
    from topoplan.topology.nccl_xml_write import checked_nccl_xml

    export = checked_nccl_xml(topo, allow_invented_bus_ids)
    for line in export.invented:
        print(f"topoplan: note: nccl-xml: {line}", file=sys.stderr)
    return export.text


def emit(topo: Topology, fmt: str, output: str | None = None, allow_invented_bus_ids: bool = False) -> None:
    """Render `topo` as `fmt` to stdout, or atomically to `output` (required for svg/png). nccl-xml: refused when
    it would make up device bus ids unless `allow_invented_bus_ids`; what it makes up is noted on stderr."""
    if fmt not in FORMATS:
        raise TopoplanError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    if allow_invented_bus_ids and fmt != "nccl-xml":
        raise TopoplanError(f"--allow-invented-bus-ids goes with --format nccl-xml, not {fmt}")
    if fmt in IMAGE_FORMATS:
        if output is None:
            raise TopoplanError(f"--format {fmt} writes a picture: give the file with -o FILE")
        from topoplan.topology.render.image import render_image

        render_image(topo, fmt, output)
    elif fmt == "table" and output is None:
        _print_table(topo)
    else:
        text = _plain_table(topo) if fmt == "table" else _nccl_xml(topo, allow_invented_bus_ids) \
            if fmt == "nccl-xml" else _text(topo, fmt)
        if output is None:
            sys.stdout.write(text)
        else:
            from topoplan.atomic import write_atomic

            write_atomic(output, text)
