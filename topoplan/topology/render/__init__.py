"""Renderers of a topology, one module per format; `emit` picks one and writes to stdout or a file.

Each renderer is imported only when chosen, so `--json` never loads rich tables.
"""

from __future__ import annotations

import sys

from topoplan.errors import TopoplanError
from topoplan.topology.model import Topology

FORMATS = ("table", "json", "dot", "mermaid", "svg", "png")
IMAGE_FORMATS = ("svg", "png")
# Width for the table when stdout is not a terminal (a pipe, a file): wide enough for 8 GPUs x 18 NICs.
PIPE_WIDTH = 200


def _text(topo: Topology, fmt: str) -> str:
    from topoplan.topology.diagnose import diagnose

    if fmt == "json":
        import json

        from topoplan.topology.export import topology_dict

        return json.dumps(topology_dict(topo, diagnose(topo)), indent=2) + "\n"
    if fmt == "dot":
        from topoplan.topology.render.dot import render_dot

        return render_dot(topo)
    if fmt == "mermaid":
        from topoplan.topology.render.mermaid import render_mermaid

        return render_mermaid(topo)
    raise ValueError(fmt)


def _table(topo: Topology, output: str | None) -> str | None:
    """Print the table to stdout (colour when it is a terminal), or return it as plain text for a file."""
    import io
    import os

    from rich.console import Console

    from topoplan.topology.diagnose import diagnose
    from topoplan.topology.render.table import render_table

    view = render_table(topo, diagnose(topo))
    if output is None:
        console = Console()
        if not console.is_terminal and "COLUMNS" not in os.environ:
            console.width = PIPE_WIDTH
        console.print(view)
        return None
    buffer = io.StringIO()
    Console(file=buffer, width=PIPE_WIDTH, color_system=None).print(view)
    return buffer.getvalue()


def emit(topo: Topology, fmt: str, output: str | None = None) -> None:
    """Render `topo` as `fmt` to stdout, or atomically to `output` (required for svg/png)."""
    if fmt not in FORMATS:
        raise TopoplanError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    if fmt in IMAGE_FORMATS:
        if output is None:
            raise TopoplanError(f"--format {fmt} writes a picture: give the file with -o FILE")
        from topoplan.topology.render.dot import render_dot
        from topoplan.topology.render.image import render_image

        render_image(render_dot(topo), fmt, output)
        return
    text = _table(topo, output) if fmt == "table" else _text(topo, fmt)
    if output is not None and text is not None:
        from topoplan.atomic import write_atomic

        write_atomic(output, text)
    elif text is not None:
        sys.stdout.write(text)
