"""The live NVML source: ask this machine's driver (through nvidia-ml-py, imported only here), read sysfs,
and build the topology from that recording, optionally saving it (`--save`)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from topoplan.errors import TopoplanError
from topoplan.topology.model import Topology
from topoplan.topology.nvml_query import is_error, query_nvml
from topoplan.topology.recording import new_recording, save_recording, topology_from_recording
from topoplan.topology.sysfs_nics import read_sysfs

SOURCE = "NVML"


def _pynvml() -> ModuleType:
    try:
        import pynvml
    except ImportError:
        raise TopoplanError("NVML is not available: the nvidia-ml-py package is not installed") from None
    return pynvml


CPUINFO = Path("/proc/cpuinfo")


def read_cpu_model(cpuinfo: str | Path | None = None) -> str | None:
    """The CPU's model name as /proc/cpuinfo gives it (x86 `model name`, POWER `cpu`), None if unreadable:
    NVML does not report the CPU, and its family sets the SYS-hop figures (topology.links.CPU_LINKS)."""
    try:
        lines = Path(cpuinfo or CPUINFO).read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "cpu") and value.strip():
            return value.strip()
    return None


def record_machine(sysfs_root: str | Path = "/sys", nvml: ModuleType | None = None,
                   cpuinfo: str | Path | None = None) -> dict[str, Any]:
    """This machine's raw NVML and sysfs answers (and its CPU model) as a recording. No driver ->
    TopoplanError."""
    nvml = nvml or _pynvml()
    started = time.perf_counter()
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as error:
        raise TopoplanError(f"NVML could not start ({error}): no NVIDIA driver or GPU here") from None
    try:
        answers = query_nvml(nvml)
    except nvml.NVMLError as error:
        raise TopoplanError(f"NVML could not list the GPUs ({error})") from None
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass  # the answers are in; a failing shutdown changes none of them
    queried = time.perf_counter()
    sysfs = read_sysfs([g["pci_bus_id"] for g in answers["gpus"] if isinstance(g.get("pci_bus_id"), str)
                        and not is_error(g["pci_bus_id"])], sysfs_root)
    timings = {"nvml_s": round(queried - started, 6), "sysfs_s": round(time.perf_counter() - queried, 6)}
    return new_recording(answers, sysfs, dict(os.environ),
                         extra={"timings": timings, "cpu": {"model_name": read_cpu_model(cpuinfo)}})


def read_nvml_topology(save: str | Path | None = None, sysfs_root: str | Path = "/sys",
                       nvml: ModuleType | None = None, cpuinfo: str | Path | None = None) -> Topology:
    """This machine's topology from NVML, sysfs and /proc/cpuinfo; with `save`, the recording is written
    there too."""
    recording = record_machine(sysfs_root, nvml, cpuinfo)
    if save is not None:
        save_recording(recording, save)
    return topology_from_recording(recording, source=SOURCE)
