"""Predicted vs published for each engine profile: the rows of tests/data/engine_measurements.json priced by
the planner with that engine's profile (topoplan/engines), and the same model and layouts under the issue's
aiconfigurator comparison.

Shared by tests/test_engine_validation.py (tolerances), benchmarks/engine_table.py (the docs table) and
benchmarks/engine_fit.py (the grid search behind the fitted constants). The measured TPOT is the mean over a
request of a serving run at closed-loop concurrency B: each of its decode steps runs B sequences, and while
it decodes the B-1 others are replaced once each, their prefills sharing its steps (chunked or not), so
    TPOT = decode step at batch B + (B-1) / gen x prefill of one prompt
Rows where that prefill share is over a quarter of the predicted TPOT are outside what the cost model
prices (it has no scheduler: how an engine interleaves prefills is its own); they are listed, not checked.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from topoplan.engines import resolve
from topoplan.engines.engine import Engine
from topoplan.hardware import find_gpu
from topoplan.layout import Layout
from topoplan.models import ModelSpec, find_model, spec_from_config
from topoplan.plan.cost import Workload
from topoplan.plan.device import DeviceSpec
from topoplan.plan.rank import plan
from topoplan.topology.model import Gpu, Topology, build_topology

ROOT = Path(__file__).resolve().parent.parent
PUBLISHED = json.loads((ROOT / "tests" / "data" / "engine_measurements.json").read_text())
# NVLink links per GPU pair as `nvidia-smi topo -m` prints them on an 8-GPU NVSwitch board (HGX B200: 18 NVLink 5
# links per GPU, topoplan.hardware; a GB200 NVL72 tray's GPUs reach each other the same way, over its switches)
NVLINKS = {"sm80": "NV12", "sm90": "NV18", "sm100": "NV18"}


@dataclass(frozen=True)
class EngineRow:
    engine: str  # as measured, e.g. vllm@0.12.0
    profile: str  # the profile that prices it, e.g. vllm@0.32
    gpu: str
    model: str
    dtype: str
    layout: Layout
    batch: int
    prompt: int
    gen: int
    role: str  # "fit" or "check"
    measured: float  # TPOT ms
    predicted: float
    prefill_share: float  # of `predicted`, the part that is other requests' prefills
    layers: int

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1


def board(gpu_key: str) -> Topology:
    """An 8-GPU NVSwitch board (DGX/HGX) of this GPU: every pair on NVLink."""
    arch = find_gpu(gpu_key).arch
    gpus = [Gpu(f"GPU{i}", i) for i in range(8)]
    codes = {(a.id, b.id): NVLINKS[arch] for a in gpus for b in gpus if a.index < b.index}
    return build_topology(gpus, [], codes, arch=arch, gpu_name=find_gpu(gpu_key).key)


def model_of(name: str) -> ModelSpec:
    configs = PUBLISHED["models"]
    return spec_from_config(configs[name], name) if name in configs else find_model(name)


def price(profile: Engine, gpu_key: str, model: ModelSpec, layout: Layout, work: Workload):
    """The planner's cost of one layout on the GPU's 8-GPU board under this engine profile."""
    topo, device = board(gpu_key), DeviceSpec.from_gpu(find_gpu(gpu_key))
    result = plan(topo, model, device, work, tp=layout.tp, pp=layout.pp, dp=layout.dp, engine=profile)
    return result.layouts[0].cost


INTERFERENCE_LIMIT = 0.25  # largest prefill share of a checked row's TPOT


def serving_tpot(profile: Engine, gpu_key: str, model: ModelSpec, layout: Layout, batch: int, prompt: int,
                 gen: int, dtype: str) -> tuple[float, float]:
    """(mean TPOT of a closed-loop run at concurrency `batch`, the share of it that is prefills) (docstring).
    An engine whose prefill steps run alone, prefill first (scheduler "separate": SGLang) runs such a loop in
    waves, which the formula above does not describe: its TPOT is the served model's (docs/planner.md
    section 4), the wave's prefills after a request's first token spread over its gen - 1 steps."""
    cost = price(profile, gpu_key, model, layout, Workload(batch, prompt, gen, dtype))
    step = cost.decode_ms_per_token
    if profile.scheduler.mode == "separate":
        tpot = cost.served.replica.tpot_ms
        return tpot, 1 - step / tpot
    prefill = (batch - 1) / gen * price(profile, gpu_key, model, layout, Workload(1, prompt, gen, dtype)).prefill_ms
    return step + prefill, prefill / (step + prefill)


def in_scope(row: EngineRow) -> bool:
    return row.prefill_share <= INTERFERENCE_LIMIT


def engine_rows(overrides: dict[str, Engine] | None = None, role: str | None = None) -> list[EngineRow]:
    """Every published row (of one role: "fit" or "check") priced by the profile covering its engine version
    (`overrides`: profile by engine name, for the fit)."""
    out = []
    for r in PUBLISHED["rows"]:
        if role is not None and r["role"] != role:
            continue
        profile = resolve(r["engine"])
        profile = (overrides or {}).get(profile.name, profile)
        gpu, layout = r["gpu"].replace("_", "-"), Layout(r["tp"], r["pp"])
        model = model_of(r["model"])
        predicted, share = serving_tpot(profile, gpu, model, layout, r["concurrency"], r["prompt"], r["gen"],
                                        r["dtype"])
        out.append(EngineRow(r["engine"], str(profile), gpu, r["model"], r["dtype"], layout, r["concurrency"],
                             r["prompt"], r["gen"], r["role"], r["tpot_ms"], predicted, share, model.layers))
    return out


def with_overheads(profile: Engine, **values: float) -> Engine:
    return replace(profile, overheads=replace(profile.overheads, **values))
