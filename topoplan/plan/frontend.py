"""A plan request -> a Plan: find the model, the topology, the GPU and the calibration, then plan.

Kept out of cli.py so the command stays options-and-render, and so Python callers (and tests) drive the
same path: `plan_for(PlanRequest(model="70b", topo="topo.txt", gpu="a100-80gb"))`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from topoplan.engines import Engine, default_engine, resolve
from topoplan.errors import TopoplanError
from topoplan.hardware import infer_gpu_family, lookup_gpu
from topoplan.machine import load_topology
from topoplan.model_aliases import ALIAS_HELP
from topoplan.models import ModelSpec, find_model
from topoplan.option_fields import nested, option
from topoplan.plan import aic_estimator
from topoplan.plan.aic_estimator import ESTIMATORS
from topoplan.plan.calibration import Calibration, load_calibration
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
    """What `topoplan plan` is asked; checked when built, before any file is read. Its fields (and its workload's
    and limits') declare the command's options (topoplan.option_fields)."""

    model: str = field(metadata=option(  # catalog name or alias, a HF checkpoint folder or its config.json
        "--model", "-m", help=f"Catalog name, alias ({ALIAS_HELP}), a HF checkpoint folder or its config.json."))
    topo: str | None = field(default=None, metadata=option(  # None: this machine
        "--topo", "--file", help="`nvidia-smi topo -m` text file or NVML recording (--file is the same option); "
        "default: read this machine through NVML."))
    gpu: str | None = field(default=None, metadata=option(  # the GPU, for pastes, which do not name it
        "--gpu", help="GPU model (a100-80gb, h100, ...); needed with --topo text, which names no GPU."))
    cpu: str | None = field(default=None, metadata=option(  # None: a recording's CPU model, else Intel Skylake
        "--cpu", help="CPU family, for SYS (socket-crossing) hops: intel-broadwell, intel-skylake (default), "
        "intel-sapphire-rapids, intel-emerald-rapids, amd-zen, power9, arm."))
    nodes: int = field(default=1, metadata=option("--nodes", help="Identical nodes of this topology."))
    workload: Workload = field(default_factory=Workload, metadata=nested())  # checks itself
    objective: str = field(default="latency", metadata=option("--objective", help="latency (request time) or "
                                                              "throughput (tokens/s per GPU)."))
    max_tp: int | None = field(default=None, metadata=option("--max-tp", help="Largest TP degree to consider."))
    tp: int | None = field(default=None, metadata=option("--tp", help="Fix the TP degree."))
    pp: int | None = field(default=None, metadata=option("--pp", help="Fix the PP degree."))
    dp: int | None = field(default=None, metadata=option("--dp", help="Fix the DP degree (all three: price one "
                                                         "layout)."))
    ep: int | None = field(default=None, metadata=option(  # None: price ep 1 and ep = tp x dp
        "--ep", help="MoE models: fix the expert-parallel degree (1: experts TP-sharded; else tp x dp, vLLM's "
        "--enable-expert-parallel). Default: price both."))
    nic_gbps: float | None = field(default=None, metadata=option(  # None: by GPU generation
        "--nic-gbps", help="Per-NIC bandwidth between nodes, GB/s (bytes); default by GPU generation (A100: 25, H100: "
        "50)."))
    calibration: str | None = field(default=None, metadata=option(  # over the engine's constants; None: the engine's
        "--calibration", help="Calibration JSON (docs/planner.md) overriding the cost model's constants."))
    engine: Engine = field(default_factory=default_engine, metadata=option(  # NAME or NAME@VERSION, resolved when built
        "--engine", type=str, default="topoplan", help="Serving engine to price for: topoplan (the bundled runner), "
        "vllm, sglang, trtllm; NAME@VERSION for an older profile, e.g. vllm@0.2 (docs/engines.md)."))
    limits: Limits = field(default_factory=Limits, metadata=nested())  # --max-ttft-ms / --max-tpot-ms (checks itself)
    search_batch: bool | None = None  # price each layout at its best batch; None: for the throughput objective
    gpus: str | None = field(default=None, metadata=option(  # topology.subset; None: all
        "--gpus", help="Plan on these GPUs of the machine only, e.g. 4,5,6,7 or 4-7 (a shared node, a broken GPU); "
        "default: all."))
    dtype_given: bool = True  # workload.dtype was asked (`--dtype`), not a default a quantised checkpoint replaces
    estimator: str = field(default="builtin", metadata=option(  # topoplan.plan.aic_estimator
        "--estimator", help="Kernel times: builtin (topoplan's roofline) or aiconfigurator (its measured data per "
        "GPU and engine version, with topoplan's links; pip install 'topoplan[aiconfigurator]'; docs/planner.md)."))

    def __post_init__(self) -> None:
        if self.cpu is not None:
            cpu_links(self.cpu)  # an unknown family is refused before any file is read
        check_search(nodes=self.nodes, objective=self.objective, max_tp=self.max_tp, tp=self.tp, pp=self.pp,
                     dp=self.dp, ep=self.ep)
        if self.nic_gbps is not None and not (math.isfinite(self.nic_gbps) and self.nic_gbps > 0):
            raise TopoplanError(f"--nic-gbps must be a positive finite number, got {self.nic_gbps}")
        object.__setattr__(self, "engine", resolve(self.engine))  # an unknown one fails here, before any file
        if self.estimator not in ESTIMATORS:
            raise TopoplanError(f"--estimator {self.estimator!r}: expected one of {', '.join(ESTIMATORS)}")


    @classmethod
    def from_cli(cls, kwargs: dict[str, Any]) -> PlanRequest:
        """From the command line (topoplan.option_fields.build), where --batch and --dtype default to "not given":
        batch 1, or each layout's best batch for the throughput objective; bf16, or what a quantised checkpoint
        stores. The engine is resolved first, as the request's first check."""
        work, limits = kwargs["workload"], kwargs["limits"]
        engine = resolve(kwargs["engine"])
        workload = Workload(**{**work, "batch": 1 if work["batch"] is None else work["batch"],
                               "dtype": work["dtype"] or "bf16"})
        return cls(**{**kwargs, "engine": engine, "workload": workload, "limits": Limits(**limits),
                      "dtype_given": work["dtype"] is not None,
                      "search_batch": kwargs["objective"] == "throughput" and work["batch"] is None})


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
    kernels = None
    if r.estimator == "aiconfigurator":
        kernels = aic_estimator.load(spec, device.name, engine, workload.dtype, workload.kv.short)
    else:
        notes = (*notes, *aic_estimator.note_for(device.name, engine))
    result = plan(topology, spec, device, workload, calibration=cal, nodes=r.nodes, objective=r.objective,
                  max_tp=r.max_tp, tp=r.tp, pp=r.pp, dp=r.dp, ep=r.ep, engine=engine, limits=r.limits,
                  search_batch=r.search_batch, kernels=kernels)
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
