"""PNG of a topology: the laid-out scene (scene.py) painted by a small rasteriser and encoded with zlib, so a
picture needs no Graphviz, font file or imaging library.

Every shape is a filled polygon (scan-line, even-odd, sampled at pixel centres); a line is a thin
polygon along each segment, a curve is sampled into segments, text is the bitmap font of font.py. No
anti-aliasing: the picture is a diagram. It is drawn at SCALE times the scene's size, for screens that
would otherwise show the 5 x 7 font too small.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Sequence

from topoplan.topology.render.font import CELL_W, GLYPH_H, glyph
from topoplan.topology.render.scene import (
    BACKGROUND,
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

SCALE = 2
CURVE_STEPS = 24
DASH = (6.0, 4.0)  # on, off (scene pixels)
Point = tuple[float, float]
Rgb = bytes


def rgb(color: str) -> Rgb:
    """`#rrggbb` as three bytes."""
    return bytes.fromhex(color.lstrip("#"))


class Canvas:
    """An RGB image in scene coordinates (each scene pixel SCALE x SCALE image pixels)."""

    def __init__(self, width: float, height: float, background: str) -> None:
        self.w, self.h = math.ceil(width * SCALE), math.ceil(height * SCALE)
        self.pixels = bytearray(rgb(background) * (self.w * self.h))

    def _span(self, y: int, x0: int, x1: int, color: Rgb) -> None:
        x0, x1 = max(x0, 0), min(x1, self.w - 1)
        if 0 <= y < self.h and x0 <= x1:
            start = (y * self.w + x0) * 3
            self.pixels[start:start + (x1 - x0 + 1) * 3] = color * (x1 - x0 + 1)

    def polygon(self, points: Sequence[Point], color: Rgb) -> None:
        """Fill a polygon (scene coordinates)."""
        pts = [(x * SCALE, y * SCALE) for x, y in points]
        sides = [(a, b) for a, b in zip(pts, pts[1:] + pts[:1]) if a[1] != b[1]]
        if not sides:
            return
        top = max(0, math.floor(min(y for _, y in pts)))
        bottom = min(self.h - 1, math.ceil(max(y for _, y in pts)))
        for y in range(top, bottom + 1):
            yc = y + 0.5
            xs = sorted(xa + (yc - ya) * (xb - xa) / (yb - ya)
                        for (xa, ya), (xb, yb) in sides if min(ya, yb) <= yc < max(ya, yb))
            for left, right in zip(xs[::2], xs[1::2]):
                self._span(y, math.ceil(left - 0.5), math.floor(right - 0.5), color)

    def segment(self, a: Point, b: Point, width: float, color: Rgb) -> None:
        """A straight stroke `width` scene pixels wide (at least one image pixel)."""
        dx, dy = b[0] - a[0], b[1] - a[1]
        length = math.hypot(dx, dy)
        if length == 0:
            return
        half = max(width, 1.2 / SCALE) / 2
        nx, ny = -dy / length * half, dx / length * half
        self.polygon([(a[0] + nx, a[1] + ny), (b[0] + nx, b[1] + ny), (b[0] - nx, b[1] - ny),
                      (a[0] - nx, a[1] - ny)], color)

    def polyline(self, points: Sequence[Point], width: float, color: Rgb, dashed: bool = False) -> None:
        """Stroke a path; dashed paths alternate DASH lengths along it."""
        if not dashed:
            for a, b in zip(points, points[1:]):
                self.segment(a, b, width, color)
            return
        phase, on = 0.0, True  # distance into the current dash or gap
        for a, b in zip(points, points[1:]):
            length, done = math.hypot(b[0] - a[0], b[1] - a[1]), 0.0
            while done < length:
                step = min(DASH[0 if on else 1] - phase, length - done)
                if on:
                    t0, t1 = done / length, (done + step) / length
                    self.segment((a[0] + (b[0] - a[0]) * t0, a[1] + (b[1] - a[1]) * t0),
                                 (a[0] + (b[0] - a[0]) * t1, a[1] + (b[1] - a[1]) * t1), width, color)
                done += step
                phase += step
                if phase >= DASH[0 if on else 1]:
                    phase, on = 0.0, not on

    def text(self, text: str, x: float, baseline: float, color: Rgb, anchor: str = "middle") -> None:
        """Bitmap text: `x` is its centre (anchor middle) or left edge (start); the glyphs sit on `baseline`."""
        width = len(text) * CELL_W - 1
        left = round((x * SCALE - width * SCALE / 2) if anchor == "middle" else x * SCALE)
        top = round(baseline * SCALE - GLYPH_H * SCALE)
        for i, char in enumerate(text):
            for col, row in glyph(char):
                px, py = left + (i * CELL_W + col) * SCALE, top + row * SCALE
                for dy in range(SCALE):
                    self._span(py + dy, px, px + SCALE - 1, color)

    def png(self) -> bytes:
        """The image as a PNG file (8-bit RGB, no filtering, one zlib stream)."""
        stride = self.w * 3
        raw = b"".join(b"\x00" + bytes(self.pixels[y * stride:(y + 1) * stride]) for y in range(self.h))

        def chunk(tag: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

        header = struct.pack(">IIBBBBB", self.w, self.h, 8, 2, 0, 0, 0)  # 8 bits, truecolour, no interlace
        return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 6)) + \
            chunk(b"IEND", b"")


def _outline(box: Box) -> list[Point]:
    if box.kind == "nic":
        turns = [2 * math.pi * i / 32 for i in range(32)]
        return [(box.cx + box.w / 2 * math.cos(a), box.cy + box.h / 2 * math.sin(a)) for a in turns]
    if box.kind == "hub":
        d = box.h / 2
        return [(box.x, box.cy), (box.x + d, box.y), (box.x + box.w - d, box.y), (box.x + box.w, box.cy),
                (box.x + box.w - d, box.y + box.h), (box.x + d, box.y + box.h)]
    return [(box.x, box.y), (box.x + box.w, box.y), (box.x + box.w, box.y + box.h), (box.x, box.y + box.h)]


def _lines_at(canvas: Canvas, lines: tuple[str, ...], x: float, top: float, anchor: str = "middle") -> None:
    for i, line in enumerate(lines):
        canvas.text(line, x, top + (i + 1) * LINE_H - 3, rgb(TEXT), anchor)


def _edge(canvas: Canvas, edge: Edge) -> None:
    points = [edge.at(i / CURVE_STEPS) for i in range(CURVE_STEPS + 1)]
    canvas.polyline(points, edge.width, rgb(edge.color), edge.dashed)


def _edge_label(canvas: Canvas, edge: Edge) -> None:
    if edge.labelled:
        mx, my = edge.at(0.5)
        half = (len(edge.label) * CELL_W) / 2 + 1
        canvas.polygon([(mx - half, my - 5), (mx + half, my - 5), (mx + half, my + 6), (mx - half, my + 6)],
                       rgb(BACKGROUND))
        canvas.text(edge.label, mx, my + 4, rgb(edge.color))


def render_png(scene: Scene) -> bytes:
    """The PNG file of a laid-out scene."""
    canvas = Canvas(scene.width, scene.height, BACKGROUND)
    if scene.title:
        canvas.text(scene.title, scene.width / 2, MARGIN + LINE_H - 3, rgb(TEXT))
    for frame in scene.frames:
        corners = _outline(frame)
        canvas.polyline([*corners, corners[0]], 1, rgb(CLUSTER_STROKE), dashed=True)
        _lines_at(canvas, frame.lines, frame.x + PAD, frame.y + frame.h - PAD - len(frame.lines) * LINE_H, "start")
    for edge in scene.edges:
        _edge(canvas, edge)
    for edge in scene.edges:
        _edge_label(canvas, edge)
    for box in scene.nodes:
        outline = _outline(box)
        canvas.polygon(outline, rgb(FILL[box.kind]))
        canvas.polyline([*outline, outline[0]], 1, rgb(STROKE[box.kind]))
        _lines_at(canvas, box.lines, box.cx, box.cy - len(box.lines) * LINE_H / 2)
    for e in scene.legend:
        canvas.segment((e.x, e.baseline - 4), (e.x + LEGEND_LINE - 6, e.baseline - 4), 3, rgb(e.color))
        canvas.text(e.text, e.x + LEGEND_LINE, e.baseline, rgb(TEXT), "start")
    return canvas.png()
