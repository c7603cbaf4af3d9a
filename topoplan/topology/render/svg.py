"""SVG of a topology, written by hand from the laid-out scene (scene.py): no Graphviz needed.

Every device is a `<g class="node gpu|nic|hub" id=...>` holding its shape and one `<text>` per label line;
every link a `<path class="edge KIND" data-a data-b data-code>` with a `<title>` (its label, shown on
hover), so tools can read the picture back. NUMA nodes are dashed frames (`class="numa"`).
"""

from __future__ import annotations

from xml.sax.saxutils import escape, quoteattr

from topoplan.topology.render.scene import (
    BACKGROUND,
    CHAR_W,
    CLUSTER_STROKE,
    FILL,
    LEGEND_LINE,
    LINE_H,
    MARGIN,
    PAD,
    STROKE,
    TEXT,
    Box,
    Edge,
    Scene,
)

FONT = f'font-family="DejaVu Sans Mono, Menlo, Consolas, monospace" font-size="{CHAR_W / 0.6:.1f}"'


def _num(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")


def _texts(lines: tuple[str, ...], cx: float, top: float, anchor: str = "middle") -> list[str]:
    return [f'<text x="{_num(cx)}" y="{_num(top + (i + 1) * LINE_H - 3)}" text-anchor="{anchor}">{escape(line)}</text>'
            for i, line in enumerate(lines)]


def _shape(box: Box) -> str:
    fill, stroke = FILL[box.kind], STROKE[box.kind]
    x, y, w, h = (_num(v) for v in (box.x, box.y, box.w, box.h))
    if box.kind == "nic":
        return (f'<ellipse cx="{_num(box.cx)}" cy="{_num(box.cy)}" rx="{_num(box.w / 2)}" ry="{_num(box.h / 2)}" '
                f'fill="{fill}" stroke="{stroke}"/>')
    if box.kind == "hub":
        d = box.h / 2
        points = [(box.x, box.cy), (box.x + d, box.y), (box.x + box.w - d, box.y), (box.x + box.w, box.cy),
                  (box.x + box.w - d, box.y + box.h), (box.x + d, box.y + box.h)]
        return f'<polygon points="{" ".join(f"{_num(px)},{_num(py)}" for px, py in points)}" fill="{fill}" ' \
               f'stroke="{stroke}"/>'
    return f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="3" fill="{fill}" stroke="{stroke}"/>'


def _node(box: Box) -> list[str]:
    top = box.cy - len(box.lines) * LINE_H / 2
    return [f'<g class="node {box.kind}" id={quoteattr(box.id)}>', f"  {_shape(box)}",
            *(f"  {t}" for t in _texts(box.lines, box.cx, top)), "</g>"]


def _frame(box: Box) -> list[str]:
    text_top = box.y + box.h - PAD - len(box.lines) * LINE_H
    return [f'<g class="numa" id={quoteattr(box.id)}>',
            f'  <rect x="{_num(box.x)}" y="{_num(box.y)}" width="{_num(box.w)}" height="{_num(box.h)}" rx="8" '
            f'fill="none" stroke="{CLUSTER_STROKE}" stroke-dasharray="5,3"/>',
            *(f"  {t}" for t in _texts(box.lines, box.x + PAD, text_top, "start")), "</g>"]


def _edge(edge: Edge) -> list[str]:
    (x0, y0), (x1, y1), (x2, y2) = edge.points
    dash = ' stroke-dasharray="6,4"' if edge.dashed else ""
    out = [f'<path class="edge {edge.kind.value}" data-a={quoteattr(edge.a)} data-b={quoteattr(edge.b)} '
           f'data-code={quoteattr(edge.code)} d="M{_num(x0)},{_num(y0)} Q{_num(x1)},{_num(y1)} {_num(x2)},{_num(y2)}" '
           f'fill="none" stroke="{edge.color}" stroke-width="{_num(edge.width)}"{dash}>'
           f"<title>{escape(edge.label)}</title></path>"]
    if edge.labelled:
        mx, my = edge.at(0.5)
        w = len(edge.label) * CHAR_W * 0.85
        out.append(f'<rect class="edge-label" x="{_num(mx - w / 2)}" y="{_num(my - LINE_H / 2)}" width="{_num(w)}" '
                   f'height="{LINE_H}" fill="{BACKGROUND}" opacity="0.85"/>')
        out.append(f'<text class="edge-label" x="{_num(mx)}" y="{_num(my + 4)}" text-anchor="middle" '
                   f'font-size="{CHAR_W / 0.6 * 0.85:.1f}" fill="{edge.color}">{escape(edge.label)}</text>')
    return out


def _legend(scene: Scene) -> list[str]:
    out = []
    for e in scene.legend:
        y = _num(e.baseline - 4)
        out.append(f'<line class="legend" x1="{_num(e.x)}" y1="{y}" x2="{_num(e.x + LEGEND_LINE - 6)}" y2="{y}" '
                   f'stroke="{e.color}" stroke-width="3"/>')
        out.append(f'<text class="legend" x="{_num(e.x + LEGEND_LINE)}" y="{_num(e.baseline)}">{escape(e.text)}</text>')
    return out


def render_svg(scene: Scene) -> str:
    """The SVG document of a laid-out scene."""
    w, h = _num(scene.width), _num(scene.height)
    lines = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" {FONT} '
             f'fill="{TEXT}">',
             f'<rect width="100%" height="100%" fill="{BACKGROUND}"/>']
    if scene.title:
        lines.append(f'<text class="title" x="{_num(scene.width / 2)}" y="{MARGIN + LINE_H - 3}" '
                     f'text-anchor="middle">{escape(scene.title)}</text>')
    for frame in scene.frames:
        lines += _frame(frame)
    for edge in scene.edges:
        lines += _edge(edge)
    for box in scene.nodes:
        lines += _node(box)
    lines += _legend(scene)
    lines.append("</svg>")
    return "\n".join(lines) + "\n"
