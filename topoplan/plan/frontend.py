"""Command-line values -> a Plan: find the model, the topology, the GPU and the calibration, then plan.

Kept out of cli.py so the command stays options-and-render, and so tests can drive the same path.
"""

from __future__ import annotations

import math
from dataclasses import replace

from topoplan.errors import TopoplanError
from topoplan.hardware import infer_gpu_family, lookup_gpu
from topoplan.dtypes import PLAN_DTYPES, checked_dtype
from topoplan.models import find_model
from topoplan.plan.calibration import Calibration, load_calibration
from topoplan.plan.cost import Workload
from topoplan.plan.device import DeviceSpec
from topoplan.plan.rank import Plan, plan
from topoplan.topology.model import Topology
from topoplan.machine import load_topology


def device_for(topology: Topology, nic_gbps: float | None) -> DeviceSpec:
    """The device of a topology whose GPU is known (NVML named it, or --gpu did through apply_gpu)."""
    spec = lookup_gpu(topology.gpu_name) if topology.gpu_name else None
    if spec is None:
        guess = infer_gpu_family(topology)
        hint = f"; {guess[1]}" if guess else ": pass --gpu NAME (e.g. a100-80gb, h100, l40s)"
        raise TopoplanError(f"which GPU is this? `topo -m` text names none{hint}", source=topology.source or None)
    if nic_gbps is not None and not (math.isfinite(nic_gbps) and nic_gbps > 0):
        raise TopoplanError(f"--nic-gbps must be a positive finite number, got {nic_gbps}")
    return DeviceSpec.from_gpu(spec, nic_gbps)


def plan_from_options(*, model: str, topo: str | None, gpu: str | None, nodes: int, batch: int, prompt_len: int,
                      gen_len: int, dtype: str, objective: str, max_tp: int | None, tp: int | None, pp: int | None,
                      dp: int | None, nic_gbps: float | None, calibration: str | None) -> Plan:
    checked_dtype(dtype, PLAN_DTYPES)
    spec = find_model(model)
    cal = load_calibration(calibration)
    topology = load_topology(topo, None, "auto", None, gpu)  # a paste, or this machine (NVML, nvidia-smi)
    device = device_for(topology, nic_gbps)
    result = plan(topology, spec, device, Workload(batch, prompt_len, gen_len, dtype), calibration=cal, nodes=nodes,
                  objective=objective, max_tp=max_tp, tp=tp, pp=pp, dp=dp)
    return replace(result, warnings=(*gpu_overrides(topology), *calibration_warnings(cal, device)))


def gpu_overrides(topology: Topology) -> tuple[str, ...]:
    """apply_gpu's note when --gpu replaced the GPU the source (an NVML recording) named: worth a warning."""
    return tuple(note for note in topology.notes if note.startswith("--gpu ") and " overrides " in note)


def calibration_warnings(cal: Calibration, device: DeviceSpec) -> tuple[str, ...]:
    """A calibration that cannot describe this plan's GPU (measured on a CPU) or changes nothing (`{}`)."""
    if cal.measured_on == "cpu":
        return (f"{cal.source} was measured on a CPU (it has a `cpu` entry): its efficiencies and link constants "
                f"describe that CPU, not this plan's {device.name}",)
    if cal.sets_nothing:
        return (f"{cal.source} sets no constant: the defaults apply",)
    return ()
