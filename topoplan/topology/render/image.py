"""SVG/PNG pictures: the topology laid out by scene.py, written by svg.py or png.py, all or nothing.

No Graphviz: `--format dot` still prints the DOT source for users who want Graphviz's own layout.
"""

from __future__ import annotations

from topoplan.atomic import write_atomic
from topoplan.topology.model import Topology


def render_image(topo: Topology, fmt: str, output: str) -> None:
    """Write the picture of `topo` as `fmt` (svg or png) to `output` atomically."""
    from topoplan.topology.render.scene import scene

    laid_out = scene(topo)
    if fmt == "svg":
        from topoplan.topology.render.svg import render_svg

        write_atomic(output, render_svg(laid_out))
    elif fmt == "png":
        from topoplan.topology.render.png import render_png

        write_atomic(output, render_png(laid_out))
    else:
        raise ValueError(fmt)
