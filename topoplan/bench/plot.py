"""busbw versus size: a self-contained SVG document (`--plot FILE`) and a one-line-per-op terminal chart.

No plotting library: a log2 x axis, a linear y axis, one polyline per op.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any
from xml.sax.saxutils import escape

from topoplan.bench.definitions import human_size, one_per_point

COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#17becf")
BARS = "▁▂▃▄▅▆▇█"


def series(results: Sequence[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """{op: [(size_bytes, busbw_gbps), ...]} in sweep order (out of place where both forms ran)."""
    out: dict[str, list[tuple[int, float]]] = {}
    for row in one_per_point(results):
        out.setdefault(row["op"], []).append((row["size_bytes"], row["busbw_gbps"]))
    return out


def sparkline(points: Sequence[tuple[int, float]], top: float) -> str:
    """busbw per size as block characters scaled to `top` (the best busbw of the whole sweep)."""
    return "".join(BARS[min(len(BARS) - 1, int(bw / top * (len(BARS) - 1) + 0.5))] if top > 0 else BARS[0]
                   for _, bw in points)


def svg(results: Sequence[dict[str, Any]], title: str, width: int = 720, height: int = 420) -> str:
    data = series(results)
    sizes = sorted({s for pts in data.values() for s, _ in pts})
    top = max((bw for pts in data.values() for _, bw in pts), default=0.0) or 1.0
    left, right, upper, lower = 70, 150, 40, 50
    plot_w, plot_h = width - left - right, height - upper - lower
    lo, hi = math.log2(sizes[0]) if sizes else 0.0, math.log2(sizes[-1]) if sizes else 1.0
    span = (hi - lo) or 1.0

    def x(size: int) -> float:
        return left + (math.log2(size) - lo) / span * plot_w

    def y(bw: float) -> float:
        return upper + plot_h - bw / top * plot_h

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'font-family="sans-serif" font-size="12">',
             f'<rect width="{width}" height="{height}" fill="white"/>',
             f'<text x="{left}" y="22" font-size="14">{escape(title)}</text>',
             f'<line x1="{left}" y1="{upper + plot_h}" x2="{left + plot_w}" y2="{upper + plot_h}" stroke="black"/>',
             f'<line x1="{left}" y1="{upper}" x2="{left}" y2="{upper + plot_h}" stroke="black"/>',
             f'<text x="{left + plot_w / 2}" y="{height - 10}" text-anchor="middle">size (bytes, log scale)</text>',
             f'<text x="15" y="{upper + plot_h / 2}" transform="rotate(-90 15 {upper + plot_h / 2})" '
             f'text-anchor="middle">busbw (GB/s)</text>']
    for size in sizes:
        parts.append(f'<text x="{x(size):.1f}" y="{upper + plot_h + 16}" text-anchor="middle">'
                     f'{human_size(size)}</text>')
    for i in range(5):
        value = top * i / 4
        parts.append(f'<text x="{left - 6}" y="{y(value) + 4:.1f}" text-anchor="end">{value:.3g}</text>')
        parts.append(f'<line x1="{left}" y1="{y(value):.1f}" x2="{left + plot_w}" y2="{y(value):.1f}" '
                     f'stroke="#ddd"/>')
    for i, (op, pts) in enumerate(data.items()):
        colour = COLOURS[i % len(COLOURS)]
        path = " ".join(f"{x(s):.1f},{y(bw):.1f}" for s, bw in pts)
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{path}"/>')
        parts.append(f'<text x="{left + plot_w + 10}" y="{upper + 16 * (i + 1)}" fill="{colour}">{escape(op)}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"

