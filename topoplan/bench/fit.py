"""Least-squares alpha-beta fits of collective timings, and the link constants the planner reads.

Per (op, link class, group size) the sweep's mean times (nccl-tests' figure) are fitted to
t(S) = alpha + beta * S, weighting each point by 1/t^2 so that the fit minimises *relative* error: a plain
fit would let the largest sizes decide everything and leave alpha (the small-message latency, which decode
lives on) to chance.

The planner prices (topoplan/plan/collectives.py)
    all_reduce over n ranks: base + 2(n-1) * alpha_link + 2(n-1)/n * S / bw_link
    all_to_all over n ranks: base + (n-1) * alpha_link + (n-1)/n * S / bw_link  (MoE dispatch and combine)
    a pipeline hand-off:     base + alpha_link + S / bw_link
so the fitted intercepts give one linear system in `base` (shared) and one alpha per link class, solved by
least squares too; bw_link is the all_reduce bus bandwidth 2(n-1)/n / beta.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from topoplan.bench.definitions import bus_factor, one_per_point


@dataclass(frozen=True)
class LineFit:
    """t(S) = alpha_us + beta_us_per_byte * S, and how well it fits (root-mean-square relative error)."""

    alpha_us: float
    beta_us_per_byte: float
    rel_rms: float


def fit_line(sizes: Sequence[float], times_us: Sequence[float]) -> LineFit:
    """Weighted least squares (weights 1/t^2) with alpha, beta >= 0.

    A negative intercept is refitted through the origin; a negative slope (pure latency, the sizes too
    small to see bandwidth) is refitted as a constant."""
    if len(sizes) != len(times_us) or not sizes:
        raise ValueError("need as many times as sizes, at least one")
    w = [1.0 / t**2 for t in times_us]
    sw = sum(w)
    sx = sum(wi * x for wi, x in zip(w, sizes))
    sy = sum(wi * y for wi, y in zip(w, times_us))
    sxx = sum(wi * x * x for wi, x in zip(w, sizes))
    sxy = sum(wi * x * y for wi, x, y in zip(w, sizes, times_us))
    det = sw * sxx - sx * sx
    beta = (sw * sxy - sx * sy) / det if det > 0 else 0.0
    alpha = (sy - beta * sx) / sw
    if beta < 0:
        alpha, beta = sy / sw, 0.0
    elif alpha < 0:
        alpha, beta = 0.0, sxy / sxx
    rel = [(alpha + beta * x - y) / y for x, y in zip(sizes, times_us)]
    return LineFit(alpha, beta, math.sqrt(sum(r * r for r in rel) / len(rel)))


@dataclass(frozen=True)
class CollectiveFit:
    op: str
    link_class: str
    group_size: int
    line: LineFit
    points: int

    @property
    def busbw_gbps(self) -> float | None:
        """The bus bandwidth the sweep tends to at large sizes; None when no size showed a bandwidth term."""
        if self.line.beta_us_per_byte <= 0:
            return None
        return bus_factor(self.op, self.group_size) / self.line.beta_us_per_byte / 1e3  # bytes/us -> GB/s

    def to_json(self) -> dict:
        return {"op": self.op, "link_class": self.link_class, "group_size": self.group_size,
                "alpha_us": self.line.alpha_us, "beta_us_per_byte": self.line.beta_us_per_byte,
                "busbw_gbps": self.busbw_gbps, "rel_rms": self.line.rel_rms, "points": self.points}


def fit_sweep(results: Iterable[dict], link_class: str, group_size: int) -> list[CollectiveFit]:
    """One fit per op of a bench result's rows, on the mean times: a workload pays the mean, stalls included
    (on a shared VM gloo's median all-reduce is a third of its mean; the runner's steps see the mean)."""
    by_op: dict[str, list[tuple[int, float]]] = {}
    for row in one_per_point(results):
        by_op.setdefault(row["op"], []).append((row["size_bytes"], row["time_us"]))
    return [CollectiveFit(op, link_class, group_size, fit_line([s for s, _ in pts], [t for _, t in pts]), len(pts))
            for op, pts in by_op.items()]


def steps(op: str, n: int) -> int | None:
    """How many link latencies the planner charges `op` over n ranks (None: an op the planner does not price)."""
    if op == "all_reduce":
        return 2 * (n - 1)
    if op == "sendrecv":
        return 1
    if op == "all_to_all":
        return n - 1
    return None


@dataclass(frozen=True)
class LinkConstants:
    base_us: float | None  # None: the fits could not separate it from the link latencies (keep the default)
    alpha_us: dict[str, float]
    bandwidth_gbps: dict[str, float]


def link_constants(fits: Sequence[CollectiveFit], default_base_us: float) -> LinkConstants:
    """Solve intercept = base + steps * alpha_class over every all_reduce, all_to_all and sendrecv fit (least
    squares).

    With fewer independent equations than unknowns (e.g. one all_reduce size and no sendrecv), `base`
    keeps `default_base_us` and each alpha is what is left of its intercept."""
    used = [f for f in fits if steps(f.op, f.group_size) is not None]
    classes = sorted({f.link_class for f in used})
    rows = [[1.0] + [float(steps(f.op, f.group_size)) if f.link_class == c else 0.0 for c in classes] for f in used]
    rhs = [f.line.alpha_us for f in used]
    base: float | None = None
    alphas: dict[str, float] = {}
    if rows:
        a = torch.tensor(rows, dtype=torch.float64)
        if int(torch.linalg.matrix_rank(a)) == len(classes) + 1:
            solution = torch.linalg.lstsq(a, torch.tensor(rhs, dtype=torch.float64)[:, None]).solution[:, 0].tolist()
            if solution[0] >= 0 and min(solution[1:]) >= 0:
                base, alphas = solution[0], dict(zip(classes, solution[1:]))
        if base is None:  # not separable (or a negative solution): fix base, least squares per class
            for c in classes:
                mine = [(steps(f.op, f.group_size), f.line.alpha_us) for f in used if f.link_class == c]
                k2 = sum(k * k for k, _ in mine)
                alphas[c] = max(0.0, sum(k * (y - default_base_us) for k, y in mine) / k2)
    bandwidth = {}
    for c in classes:
        bws = [f.busbw_gbps for f in used if f.link_class == c and f.op == "all_reduce" and f.busbw_gbps]
        if bws:
            bandwidth[c] = sum(bws) / len(bws)
    return LinkConstants(base, alphas, bandwidth)
