"""Where each shape of the picture goes: the `Picture` (what to draw) laid out in pixels, so the SVG and PNG
writers only paint. No Graphviz: the graph is small and regular, so a fixed layout reads well.

- One frame per NUMA node, left to right in node order (devices on no known node last, unframed); inside
  it the GPUs in a row, its NICs in a row below them, and the node's name and CPUs at the bottom (arcs
  leave the top of the GPU row, so they cross no text).
- An NVLink hub (an all-to-all island, picture.py) sits above the boxes, centred over its GPUs, with a
  straight edge down to each.
- A GPU-GPU edge between two GPUs of the row is an arc above the row (height grows with the distance, so
  arcs between far GPUs clear the near ones); a NIC-GPU edge is a straight line between the two rows.
- Text is measured at CHAR_W pixels per character: the SVG asks for a monospace font of that advance and
  the PNG's bitmap font (font.py) is narrower, so labels fit their boxes in both.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from topoplan.topology.links import LinkKind
from topoplan.topology.model import Link, Topology
from topoplan.topology.render.picture import KIND_COLOR, Picture, group_cpus, link_label, picture

CHAR_W, LINE_H = 7, 13  # text metrics in pixels (font size 11.5 monospace; font.py draws 6 x 8)
LABEL_W = 6  # per character of an edge label (drawn at 85 % of the font size in the SVG, 6 px in the PNG)
PAD, GAP, MARGIN = 8, 16, 16  # inside a box, between boxes, around the picture
NODE_H_LINES = 2
FILL = {"gpu": "#e8f5d0", "nic": "#dde8f7", "hub": "#f4f9ea"}
STROKE = {"gpu": "#4a7a00", "nic": "#1f4e8c", "hub": "#4a7a00"}
CLUSTER_STROKE = "#888888"
TEXT = "#000000"
BACKGROUND = "#ffffff"
LEGEND_LINE = 30  # the sample line and the space after it
ARC_MAX = 140  # the highest an arc rises above its row, pixels


@dataclass(frozen=True)
class Box:
    """A device (kind gpu, nic or hub) or a NUMA-node frame (kind numa): top-left corner, size, text lines."""

    id: str
    kind: str
    x: float
    y: float
    w: float
    h: float
    lines: tuple[str, ...]

    @property
    def cx(self) -> float:
        return self.x + self.w / 2

    @property
    def cy(self) -> float:
        return self.y + self.h / 2


@dataclass(frozen=True)
class Edge:
    """A link drawn as a quadratic curve start -> control -> end (control on the chord: a straight line)."""

    a: str
    b: str
    kind: LinkKind
    code: str
    label: str  # `NV12 240 GB/s`
    labelled: bool  # the label is drawn on the edge (GPU-GPU); a hub or a NIC says it once for its edges
    points: tuple[tuple[float, float], tuple[float, float], tuple[float, float]]
    width: float
    dashed: bool

    @property
    def color(self) -> str:
        return KIND_COLOR[self.kind]

    def at(self, t: float) -> tuple[float, float]:
        """The point at parameter t in [0, 1] on the curve."""
        (x0, y0), (x1, y1), (x2, y2) = self.points
        u = 1 - t
        return u * u * x0 + 2 * u * t * x1 + t * t * x2, u * u * y0 + 2 * u * t * y1 + t * t * y2


@dataclass(frozen=True)
class LegendEntry:
    """A sample line of a link kind's colour at (x, baseline - 4), LEGEND_LINE long, then its name."""

    text: str
    color: str
    x: float
    baseline: float


@dataclass(frozen=True)
class Scene:
    width: float
    height: float
    title: str | None
    frames: tuple[Box, ...]  # NUMA-node frames, drawn first
    nodes: tuple[Box, ...]  # GPUs, NICs, hubs
    edges: tuple[Edge, ...]
    legend: tuple[LegendEntry, ...]  # one per link kind drawn


def text_width(lines: tuple[str, ...]) -> float:
    return max((len(line) for line in lines), default=0) * CHAR_W


def _size(lines: tuple[str, ...]) -> tuple[float, float]:
    return text_width(lines) + 2 * PAD, max(len(lines), NODE_H_LINES) * LINE_H + 2 * PAD


def _style(link: Link) -> tuple[float, bool]:
    """(stroke width, dashed): fabric links (NVLink, XGMI) solid and thicker with more links, PCIe paths thin and
    dashed."""
    if link.kind.is_fabric:
        return min(1 + link.nvlinks / 2, 8.0), False
    return 1.0, True


def _device_lines(topo: Topology, device: str, lone: bool, nic_links: list[Link]) -> tuple[str, ...]:
    """Name lines; a NIC adds how it reaches its nearest GPUs (the label of its edges, said once)."""
    item = topo.graph.nodes[device]["device"]
    labels = sorted({link_label(l) for l in nic_links if device in (l.a, l.b)})
    extra = "SYS to every GPU" if lone else (f"{', '.join(labels)} to GPUs" if labels else None)
    return tuple(x for x in (device, item.name, extra) if x)


def _row(boxes: list[tuple[str, str, tuple[str, ...]]], x: float, y: float) -> list[Box]:
    out = []
    for device, kind, lines in boxes:
        w, h = _size(lines)
        out.append(Box(device, kind, x, y, w, h, lines))
        x += w + GAP
    return out


def _row_width(row: list[Box]) -> float:
    return row[-1].x + row[-1].w - row[0].x if row else 0.0


def _shift(box: Box, dx: float = 0.0, dy: float = 0.0) -> Box:
    return Box(box.id, box.kind, box.x + dx, box.y + dy, box.w, box.h, box.lines)


def _rise(a: Box, b: Box) -> float:
    """How far the arc between two boxes of a row rises above it: more for farther boxes."""
    return min(ARC_MAX, 12 + 0.35 * abs(a.cx - b.cx))


def _ports(links: list[Link], boxes: dict[str, Box]) -> dict[tuple[str, str], float]:
    """Where each arc leaves the top of each GPU box: arcs to the left from its left half, to the right from
    its right half, farther GPUs farther out, so nested arcs do not share an end or cross there."""
    ports: dict[tuple[str, str], float] = {}
    for box in boxes.values():
        others = [l.other(box.id) for l in links if box.id in (l.a, l.b)]
        left = sorted((o for o in others if boxes[o].cx < box.cx), key=lambda o: boxes[o].cx)  # far to near
        right = sorted((o for o in others if boxes[o].cx >= box.cx), key=lambda o: boxes[o].cx)  # near to far
        half = box.w / 2 - 4
        for i, other in enumerate(left):
            ports[(box.id, other)] = box.x + 4 + half * i / len(left)
        for i, other in enumerate(right):
            ports[(box.id, other)] = box.cx + half * (i + 1) / len(right)
    return ports


def _arc(a: Box, b: Box, ports: dict[tuple[str, str], float]
         ) -> tuple[tuple[float, float], tuple[float, float], tuple[float, float]]:
    """From the top of one box to the top of the other of the same row, bulging upwards (the apex of a
    quadratic curve is half way to its control point)."""
    start, end = (ports[(a.id, b.id)], a.y), (ports[(b.id, a.id)], b.y)
    return start, ((start[0] + end[0]) / 2, min(a.y, b.y) - 2 * _rise(a, b)), end


def label_box(edge: Edge) -> tuple[float, float, float, float]:
    """The rectangle (x0, y0, x1, y1) a label drawn at the middle of the edge covers."""
    x, y = edge.at(0.5)
    half = len(edge.label) * LABEL_W / 2 + 2
    return x - half, y - LINE_H / 2, x + half, y + LINE_H / 2


def _place_labels(edges: list[Edge]) -> list[Edge]:
    """Label the GPU-GPU arcs, shortest first, skipping a label that would cover one already placed: a full
    mesh of one link kind then shows every other label, the legend and (SVG) each edge's title the rest."""
    placed: list[tuple[float, float, float, float]] = []
    out = {}
    for edge in sorted((e for e in edges if e.labelled), key=lambda e: e.points[1][1], reverse=True):
        x0, y0, x1, y1 = label_box(edge)
        if any(x0 < px1 and px0 < x1 and y0 < py1 and py0 < y1 for px0, py0, px1, py1 in placed):
            out[id(edge)] = replace(edge, labelled=False)
        else:
            placed.append((x0, y0, x1, y1))
    return [out.get(id(e), e) for e in edges]


def _line(a: Box, b: Box) -> tuple[tuple[float, float], tuple[float, float], tuple[float, float]]:
    """A straight line between the facing sides of two boxes one above the other."""
    upper, lower = (a, b) if a.cy <= b.cy else (b, a)
    start, end = (upper.cx, upper.y + upper.h), (lower.cx, lower.y)
    return start, ((start[0] + end[0]) / 2, (start[1] + end[1]) / 2), end


def _group(topo: Topology, pic: Picture, numa: int | None, devices: list[str], x: float
           ) -> tuple[Box | None, list[Box], float]:
    """One NUMA node's frame (None for devices on no known node) and device boxes, from `x`; and the x where
    the next group starts."""
    kinds = {d: topo.graph.nodes[d]["kind"] for d in devices}
    lone = set(pic.lone_nics)
    head: tuple[str, ...] = ()
    if numa is not None:
        cpus = group_cpus(topo, devices)
        head = (f"NUMA node {numa}",) + ((f"CPUs {cpus}",) if cpus else ())
    pad = PAD if head else 0
    gpus = _row([(d, "gpu", _device_lines(topo, d, False, [])) for d in devices if kinds[d] == "gpu"], x + pad, pad)
    nic_top = pad + (max(b.h for b in gpus) + 2 * GAP if gpus else 0)
    nics = _row([(d, "nic", _device_lines(topo, d, d in lone, pic.nic_links))
                 for d in devices if kinds[d] == "nic"], x + pad, nic_top)
    inner_w = max(_row_width(gpus), _row_width(nics), text_width(head))
    boxes = [_shift(b, (inner_w - _row_width(row)) / 2) for row in (gpus, nics) for b in row]  # rows centred
    bottom = max((b.y + b.h for b in boxes), default=pad)
    frame = Box(f"numa{numa}", "numa", x, 0, inner_w + 2 * pad, bottom + PAD + len(head) * LINE_H + PAD,
                head) if head else None
    return frame, boxes, x + inner_w + 2 * pad + GAP


def _hubs(pic: Picture, by_id: dict[str, Box]) -> list[Box]:
    """Each all-to-all hub, centred over its GPUs (y 0: placed later)."""
    hubs = []
    for hub in pic.hubs:
        fabric = "NVLink" if hub.link.kind is LinkKind.NVLINK else "XGMI"
        lines = (f"{fabric} all-to-all", f"{link_label(hub.link)} per pair")
        w, h = _size(lines)
        centre = sum(by_id[g].cx for g in hub.gpus) / len(hub.gpus)
        hubs.append(Box(hub.id, "hub", max(MARGIN, centre - w / 2), 0, w, h, lines))
    return hubs


def _edges(pic: Picture, by_id: dict[str, Box]) -> list[Edge]:
    """Hub spokes, GPU-GPU arcs and NIC lines, labels placed."""
    edges = []
    for hub in pic.hubs:
        width, dashed = _style(hub.link)
        edges += [Edge(g, hub.id, hub.link.kind, hub.link.code, link_label(hub.link), False,
                       _line(by_id[hub.id], by_id[g]), width, dashed) for g in hub.gpus]
    ports = _ports(pic.gpu_links, {b.id: b for b in by_id.values() if b.kind == "gpu"})
    for link in pic.gpu_links:
        width, dashed = _style(link)
        edges.append(Edge(link.a, link.b, link.kind, link.code, link_label(link), True,
                          _arc(by_id[link.a], by_id[link.b], ports), width, dashed))
    for link in pic.nic_links:
        width, dashed = _style(link)
        edges.append(Edge(link.a, link.b, link.kind, link.code, link_label(link), False,
                          _line(by_id[link.a], by_id[link.b]), width, dashed))
    return _place_labels(edges)


def _legend(edges: list[Edge], baseline: float) -> list[LegendEntry]:
    """One entry per link kind drawn, closest kind first, left to right."""
    legend, x = [], float(MARGIN)
    for kind in (k for k in LinkKind if any(e.kind is k for e in edges)):
        text = "NVLink" if kind is LinkKind.NVLINK else kind.value.upper()
        legend.append(LegendEntry(text, KIND_COLOR[kind], x, baseline))
        x += LEGEND_LINE + len(text) * CHAR_W + GAP
    return legend


def scene(topo: Topology) -> Scene:
    """Lay the picture of `topo` out (see the module docstring): groups left to right, then the hubs and the
    room the arcs need above them, then the edges and the legend."""
    pic = picture(topo)
    frames: list[Box] = []
    nodes: list[Box] = []
    x = float(MARGIN)
    for numa, devices in pic.groups.items():
        frame, boxes, x = _group(topo, pic, numa, devices, x)
        frames += [frame] if frame else []
        nodes += boxes
    by_id = {b.id: b for b in nodes}
    arc_room = max((_rise(by_id[l.a], by_id[l.b]) for l in pic.gpu_links), default=0)
    hubs = _hubs(pic, by_id)
    title_h = LINE_H + GAP if topo.source else 0
    hub_room = max(b.h for b in hubs) + 3 * GAP if hubs else 0
    dy = MARGIN + title_h + hub_room + arc_room + (GAP if arc_room else 0)
    frames = [_shift(f, dy=dy) for f in frames]
    nodes = [_shift(b, dy=dy) for b in nodes]
    hubs = [_shift(b, dy=MARGIN + title_h) for b in hubs]
    edges = _edges(pic, {b.id: b for b in [*nodes, *hubs]})
    bottom = max((b.y + b.h for b in [*frames, *nodes, *hubs]), default=MARGIN)
    legend = _legend(edges, bottom + GAP + LINE_H - 3)
    height = bottom + (GAP + LINE_H if legend else 0) + MARGIN
    right = max([x - GAP, MARGIN + text_width((topo.source or "",)), *(b.x + b.w for b in hubs),
                 *(e.x + LEGEND_LINE + len(e.text) * CHAR_W for e in legend)])
    return Scene(right + MARGIN, height, topo.source or None, tuple(frames), tuple([*hubs, *nodes]), tuple(edges),
                 tuple(legend))
