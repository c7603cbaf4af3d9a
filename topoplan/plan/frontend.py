"""Command-line values -> a Plan: find the model, the topology, the GPU and the calibration, then plan.

Kept out of cli.py so the command stays options-and-render, and so tests can drive the same path.
"""

from __future__ import annotations

from topoplan.errors import TopoplanError
from topoplan.hardware import find_gpu, lookup_gpu
from topoplan.models import DTYPE_BYTES, find_model
from topoplan.plan.calibration import load_calibration
from topoplan.plan.cost import Workload
from topoplan.plan.device import DeviceSpec
from topoplan.plan.rank import Plan, plan
from topoplan.topology.model import Topology


def load_topology(topo: str | None) -> Topology:
    """A `topo -m` text file, or this machine through NVML."""
    if topo is not None:
        from topoplan.topology.read import read_topology

        return read_topology(topo)
    try:
        from topoplan.topology.nvml_reader import read_nvml_topology
    except ImportError:
        raise TopoplanError("no --topo FILE given and NVML discovery is not available in this build") from None
    return read_nvml_topology()


def device_for(topology: Topology, gpu: str | None, nic_gbps: float | None) -> tuple[Topology, DeviceSpec]:
    """The GPU spec (--gpu, else the name NVML reported) and the topology re-estimated for its generation."""
    spec = find_gpu(gpu) if gpu else (lookup_gpu(topology.gpu_name) if topology.gpu_name else None)
    if spec is None:
        raise TopoplanError("which GPU is this? `topo -m` text names none: pass --gpu NAME (e.g. a100-80gb, h100)",
                            source=topology.source or None)
    if nic_gbps is not None and nic_gbps <= 0:
        raise TopoplanError(f"--nic-gbps must be above 0, got {nic_gbps}")
    if topology.arch != spec.arch:
        topology = topology.with_arch(spec.arch, spec.key)
    return topology, DeviceSpec.from_gpu(spec, nic_gbps)


def plan_from_options(*, model: str, topo: str | None, gpu: str | None, nodes: int, batch: int, prompt_len: int,
                      gen_len: int, dtype: str, objective: str, max_tp: int | None, tp: int | None, pp: int | None,
                      dp: int | None, nic_gbps: float | None, calibration: str | None) -> Plan:
    if dtype not in DTYPE_BYTES:
        raise TopoplanError(f"unknown --dtype {dtype!r}; expected one of {', '.join(DTYPE_BYTES)}")
    spec = find_model(model)
    cal = load_calibration(calibration)
    topology, device = device_for(load_topology(topo), gpu, nic_gbps)
    return plan(topology, spec, device, Workload(batch, prompt_len, gen_len, dtype), calibration=cal, nodes=nodes,
                objective=objective, max_tp=max_tp, tp=tp, pp=pp, dp=dp)
