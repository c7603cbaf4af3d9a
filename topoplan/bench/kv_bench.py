"""`topoplan bench --kv-transfer`: measure one request's KV cache moving from a prefill rank to a decode rank on
this machine (topoplan.bench.kv_worker), and set beside each figure the price the planner gives for it
(topoplan.plan.kv_transfer.price_transfer).

The planner prices a transfer with a link's latency (alpha) and bandwidth. Here the link is this host's shared
memory, or loopback TCP under gloo; both are CPU-process pairs, which the planner sees as its `cpu` machine
(topoplan.machine.cpu_topology: every pair joined by the `node` link class), so each price is price_transfer on
that machine with the `node` class set to:
  * the path's own constants, fitted (topoplan.bench.fit.fit_line) on one-way transfers of FIT_SIZES measured
    by the same ranks before the KV sizes: the KV sizes above FIT_SIZES are held out (`held_out`), so the ratio
    checks the model's extrapolation, not its fit;
  * with `calibration`, the `node` link of a `topoplan calibrate` file, as `plan --device cpu` prices with it
    (measured by calibrate's collective sweep: another program, other sizes).
Times are medians over the iterations (a request's transfer is one draw; the mean on this shared VM carries
multi-ms TCP stalls, reported beside it).
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from topoplan.bench.definitions import parse_sizes
from topoplan.bench.fit import fit_line
from topoplan.bench.kv_request import FIT_SIZES, KvBenchRequest
from topoplan.bench.launch import spawn_json
from topoplan.dtypes import dtype_of
from topoplan.errors import TopoplanError
from topoplan.layout import Layout
from topoplan.machine import CPU_LINK, cpu_topology
from topoplan.models import ModelSpec
from topoplan.plan.calibration import Calibration, LinkCalibration
from topoplan.plan.calibration_file import load_calibration
from topoplan.plan.collectives import LinkPricer
from topoplan.plan.disagg_types import KvRoute, KvTransfer, Worker
from topoplan.plan.kv_transfer import price_transfer
from topoplan.topology.links import parse_link_code

NODE = parse_link_code(CPU_LINK)[1].value  # the calibration class of CPU rank pairs: `node`


def fitted_link(points: list[dict[str, Any]]) -> dict[str, Any]:
    """alpha and bandwidth of one path from its FIT_SIZES points (median times; weighted least squares)."""
    line = fit_line([p["bytes_moved"] for p in points], [p["median_us"] for p in points])
    if line.beta_us_per_byte <= 0:
        raise TopoplanError(f"the {points[0]['path']} fit found no bandwidth term (times did not grow with size "
                            "over " + FIT_SIZES + "): the machine was too busy to measure; run it again")
    return {"alpha_us": line.alpha_us, "bandwidth_gbps": 1 / line.beta_us_per_byte / 1e3, "rel_rms": line.rel_rms,
            "source": f"fit on one-way transfers of {FIT_SIZES} on this path"}


def calibration_link(path: str) -> dict[str, Any]:
    """The `node` link of a calibration file (its bandwidth must have been measured)."""
    link = load_calibration(path).link(NODE)
    if not link.bandwidth_gbps:
        raise TopoplanError(f"links.{NODE}: no bandwidth_gbps (run `topoplan calibrate` on this machine)",
                            source=path)
    return {"alpha_us": link.alpha_us, "bandwidth_gbps": link.bandwidth_gbps, "rel_rms": None,
            "source": f"{path}: links.{NODE}, as `plan --device cpu` prices with it"}


def _worker(role: str, gpu: str) -> Worker:
    return Worker(role, 0, 0, Layout(), (gpu,), (), (0,), (KvRoute(gpu, None, None, None),))


def price(model: ModelSpec, prompt_tokens: int, dtype: str, mode: str, link: dict[str, Any]) -> KvTransfer:
    """price_transfer between two CPU ranks of this host whose `node` link has `link`'s constants: a bare
    transfer, no engine connector's fixed cost (setup_us 0), as the bench measures it."""
    calibration = Calibration()
    calibration = replace(calibration, links={**calibration.links,
                                              NODE: LinkCalibration(link["alpha_us"], link["bandwidth_gbps"])})
    pricer = LinkPricer(cpu_topology(2), calibration, nic_gbps=1.0)  # one host: no NIC on the path
    return price_transfer(pricer, model, prompt_tokens, dtype_of(dtype).short, _worker("prefill", "CPU0"),
                          _worker("decode", "CPU1"), connector=mode, setup_us=0.0)


def row(point: dict[str, Any], request: KvBenchRequest, links: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One KV point with its prices: by its own path's fit, and by the calibration file where given."""
    spec, held_out = request.spec, point["bytes_moved"] > max(parse_sizes(FIT_SIZES))
    measured_ms = point["median_us"] / 1e3
    out = {**point, "kv_bytes": request.kv_bytes(point["prompt_tokens"]), "measured_ms": measured_ms,
           "mean_ms": point["time_us"] / 1e3, "min_ms": point["min_us"] / 1e3,
           "gbps": point["bytes_moved"] / measured_ms / 1e6 if measured_ms else None, "held_out": held_out}
    for key, link in (("priced", links[point["path"]]), ("calibration", links.get("calibration"))):
        if link is None:
            continue
        priced = price(spec, point["prompt_tokens"], request.dtype, point["mode"], link)
        out |= {f"{key}_ms": priced.ms, f"{key}_gbps": priced.gbps,
                f"{key}_ratio": measured_ms / priced.ms if priced.ms else None}
    return out


def kv_transfer_bench(request: KvBenchRequest, echo: bool = True) -> dict[str, Any]:
    """Measure (2 ranks), fit each path's link on its FIT_SIZES points, price every KV point (docs/bench.md)."""
    links = {"calibration": calibration_link(request.calibration)} if request.calibration else {}
    load_before = os.getloadavg()
    measured = spawn_json(2, "topoplan.bench.kv_worker", request.worker_argv(), echo=echo, what="KV transfer bench")
    points = measured.pop("points")
    paths = list(dict.fromkeys(p["path"] for p in points))
    for path in paths:
        links[path] = fitted_link([p for p in points if p["path"] == path and p["prompt_tokens"] == 0])
    rows = [row(p, request, links) for p in points if p["prompt_tokens"]]
    return {**measured, "paths": paths, "prompts": list(request.prompts),
            "kv_bytes_per_token": request.spec.kv_bytes_per_token(dtype_of(request.dtype).short),
            "layers": request.spec.layers, "links": links, "rows": rows,
            "fit_points": [p for p in points if not p["prompt_tokens"]],
            "load_average": {"before": list(load_before), "after": list(os.getloadavg())}}
