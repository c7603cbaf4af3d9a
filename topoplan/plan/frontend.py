"""A plan request -> a Plan: find the model, the topology, the GPU and the calibration, then plan.

Kept out of cli.py so the command stays options-and-render, and so Python callers (and tests) drive the
same path: `plan_for(PlanRequest(model="70b", topo="topo.txt", gpu="a100-80gb"))`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from topoplan.engines import Engine, default_engine, resolve
from topoplan.errors import TopoplanError
from topoplan.hardware import infer_gpu_family, lookup_gpu
from topoplan.machine import load_topology
from topoplan.models import ModelSpec, find_model
from topoplan.plan.calibration import Calibration
from topoplan.plan.calibration_file import load_calibration
from topoplan.plan.cost import Workload
from topoplan.plan.device import DeviceSpec
from topoplan.plan.engine_costs import engine_calibration
from topoplan.plan.rank import Limits, Plan, check_search, plan
from topoplan.topology.links import cpu_links
from topoplan.topology.model import Topology
from topoplan.topology.smi_text import NVLINK_HIDDEN
from topoplan.topology.subset import gpu_subset


@dataclass(frozen=True)
class PlanRequest:
    """What `topoplan plan` is asked; checked when built, before any file is read."""

    model: str  # catalog name or alias, a HF checkpoint folder or its config.json
    topo: str | None = None  # a `topo -m` paste or NVML recording; None: this machine
    gpu: str | None = None  # the GPU, for pastes, which do not name it
    cpu: str | None = None  # CPU family of the SYS-hop figures; None: a recording's CPU model, else Intel Skylake
    nodes: int = 1
    workload: Workload = field(default_factory=Workload)  # checks itself
    objective: str = "latency"
    max_tp: int | None = None
    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    ep: int | None = None  # expert-parallel degree (MoE); None: price ep 1 and ep = tp x dp
    nic_gbps: float | None = None  # None: by GPU generation
    calibration: str | None = None  # a calibration file over the engine's constants; None: the engine's
    engine: Engine = field(default_factory=default_engine)  # NAME or NAME@VERSION is resolved when built
    limits: Limits = field(default_factory=Limits)  # --max-ttft-ms / --max-tpot-ms (checks itself)
    search_batch: bool | None = None  # price each layout at its best batch; None: for the throughput objective
    gpus: str | None = None  # `--gpus 4,5,6,7`: plan on these GPUs of the machine (topology.subset); None: all
    dtype_given: bool = True  # workload.dtype was asked (`--dtype`), not a default a quantised checkpoint replaces

    def __post_init__(self) -> None:
        if self.cpu is not None:
            cpu_links(self.cpu)  # an unknown family is refused before any file is read
        check_search(nodes=self.nodes, objective=self.objective, max_tp=self.max_tp, tp=self.tp, pp=self.pp,
                     dp=self.dp, ep=self.ep)
        if self.nic_gbps is not None and not (math.isfinite(self.nic_gbps) and self.nic_gbps > 0):
            raise TopoplanError(f"--nic-gbps must be a positive finite number, got {self.nic_gbps}")
        object.__setattr__(self, "engine", resolve(self.engine))  # an unknown one fails here, before any file


def device_for(topology: Topology, nic_gbps: float | None = None) -> DeviceSpec:
    """The device of a topology whose GPU is known (NVML named it, or --gpu did through apply_gpu). Its memory
    is the catalog's MiB for the product, or, when NVML read these very GPUs (a recording or this machine,
    not overridden by --gpu), the smallest total NVML reported for them."""
    spec = lookup_gpu(topology.gpu_name) if topology.gpu_name else None
    if spec is None:
        guess = infer_gpu_family(topology)
        hint = f"; {guess[1]}" if guess else ": pass --gpu NAME (e.g. a100-80gb, h100, l40s, mi300x)"
        raise TopoplanError(f"which GPU is this? the source names none (`topo -m`, rocm-smi, amd-smi and NCCL XML "
                            f"never do){hint}", source=topology.source or None)
    device = DeviceSpec.from_gpu(spec, nic_gbps)
    recorded = [g.memory_bytes for g in topology.gpus if g.memory_bytes]
    if recorded and not any(" overrides " in note for note in topology.notes):
        return replace(device, memory_bytes=min(recorded))
    return device


def plan_for(request: PlanRequest) -> Plan:
    """Read what the request names (model, calibration, topology and its GPU) and plan."""
    r = request
    engine = r.engine
    spec = find_model(r.model)
    workload, notes = checkpoint_workload(r.workload, spec, r.dtype_given)
    cal = load_calibration(r.calibration, engine_calibration(engine), engine.name)
    try:
        topology = load_topology(r.topo, None, "auto", None, r.gpu, r.cpu)  # a paste, or this machine
    except TopoplanError as error:
        if r.topo is not None:
            raise
        raise TopoplanError(f"{error}; on a machine without GPUs, `plan --device cpu --calibration FILE` plans "
                            "its CPU-process layouts") from None
    if r.gpus is not None:
        topology = gpu_subset(topology, r.gpus)
    device = device_for(topology, r.nic_gbps)
    result = plan(topology, spec, device, workload, calibration=cal, nodes=r.nodes, objective=r.objective,
                  max_tp=r.max_tp, tp=r.tp, pp=r.pp, dp=r.dp, ep=r.ep, engine=engine, limits=r.limits,
                  search_batch=r.search_batch)
    return replace(result, warnings=(*notes, *source_warnings(topology), *calibration_warnings(cal, device),
                                     *result.warnings))


def checkpoint_workload(workload: Workload, spec: ModelSpec, dtype_given: bool) -> tuple[Workload, tuple[str, ...]]:
    """The workload in the weights dtype a quantised checkpoint stores (its config's quantization_config), and
    the line that says so; a `--dtype` naming another is refused (an engine loads the checkpoint as stored)."""
    stored = spec.checkpoint_dtype
    if stored is None or stored == workload.dtype:
        return workload, ()
    if dtype_given:
        raise TopoplanError(f"--dtype {workload.dtype}: {spec.name}'s quantization_config stores its weights as "
                            f"{stored}; drop --dtype or pass --dtype {stored}")
    return replace(workload, dtype=stored), (f"{spec.name}: quantization_config stores the weights as {stored}: "
                                             f"planned as --dtype {stored}",)


def source_warnings(topology: Topology) -> tuple[str, ...]:
    """The source's notes that change the answer: apply_gpu's when --gpu replaced the GPU the source (an NVML
    recording) named, and a `topo -mp` paste hiding NVLink."""
    return tuple(note for note in topology.notes
                 if (note.startswith("--gpu ") and " overrides " in note) or note == NVLINK_HIDDEN)


def calibration_warnings(cal: Calibration, device: DeviceSpec) -> tuple[str, ...]:
    """A calibration that cannot describe this plan's GPU (measured on a CPU) or changes nothing (`{}`)."""
    if cal.measured_on == "cpu":
        return (f"{cal.source} was measured on a CPU (it has a `cpu` entry): its efficiencies and link constants "
                f"describe that CPU, not this plan's {device.name}",)
    if cal.sets_nothing:
        return (f"{cal.source} sets no constant: the defaults apply",)
    return ()
