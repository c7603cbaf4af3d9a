"""Ask NVML what topoplan needs, keeping every answer raw: the `nvml` part of a recording.

Answers are kept as NVML gave them (strings, enum codes, affinity bitmask words) or, when a call failed, as
`{"nvml_error": "GPU_IS_LOST"}` (the name of pynvml's `NVML_ERROR_*` constant). Interpreting them is
recording.py's job, so a replayed recording goes through exactly the decisions the live answers did.
The pynvml module is passed in: the real one on a GPU machine, a replaying fake in tests.
"""

from __future__ import annotations

import ctypes
import math
import os
import uuid
from collections.abc import Callable
from types import ModuleType
from typing import Any

NVML_FEATURE_ENABLED = 1  # nvmlEnableState_t: what nvmlDeviceGetNvLinkState returns for an active link
NODE_SET_WORDS = 4  # 64-bit words of NUMA-node mask asked for: room for 256 NUMA nodes
# nvmlDeviceGetP2PStatus capability indexes, in `nvidia-smi topo -p2p` letters. Plain numbers because
# nvidia-ml-py 13.615 defines NVML_P2P_CAPS_INDEX_READ as the tuple `(0,)` (a stray comma).
P2P_INDEXES = {"r": 0, "w": 1, "n": 2, "a": 3, "p": 4}

Answer = Any  # a raw value, or {"nvml_error": NAME}


def is_error(answer: Answer) -> bool:
    return isinstance(answer, dict) and "nvml_error" in answer


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class Asker:
    """Calls pynvml functions by name; a failure becomes an answer, not an exception."""

    def __init__(self, nvml: ModuleType):
        self.nvml = nvml
        self.error_names = {value: name.removeprefix("NVML_ERROR_") for name, value in vars(nvml).items()
                            if name.startswith("NVML_ERROR_") and isinstance(value, int)}

    def __call__(self, function: str, *args: Any, convert: Callable[[Any], Any] = lambda v: v) -> Answer:
        call = getattr(self.nvml, function, None)
        if call is None:  # an nvidia-ml-py older than the call: as NVML says of a driver without it
            return {"nvml_error": "FUNCTION_NOT_FOUND"}
        try:
            return convert(call(*args))
        except self.nvml.NVMLError as error:
            return {"nvml_error": self.error_names.get(error.value, str(error.value))}


def _bus_id(pci_info: Any) -> str:
    return _text(pci_info.busId)


def _nvlinks(ask: Asker, handle: Any) -> list[dict[str, Answer]]:
    """Each link's state, and for active ones its version and far end; stops at the first link NVML refuses
    (INVALID_ARGUMENT past the GPU's last link, NOT_SUPPORTED on GPUs without NVLink)."""
    links = []
    for link in range(ask.nvml.NVML_NVLINK_MAX_LINKS):
        state = ask("nvmlDeviceGetNvLinkState", handle, link)
        entry: dict[str, Answer] = {"state": state}
        links.append(entry)
        if is_error(state):
            break
        if state == NVML_FEATURE_ENABLED:
            entry["version"] = ask("nvmlDeviceGetNvLinkVersion", handle, link)
            entry["remote_pci_bus_id"] = ask("nvmlDeviceGetNvLinkRemotePciInfo", handle, link, convert=_bus_id)
            entry["remote_device_type"] = ask("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
    return links


def _fabric(ask: Asker, handle: Any) -> Answer:
    """The GPU's NVLink fabric info (GB200/GB300 NVL72 and other multi-node NVLink systems): which cluster and
    clique (NVLink partition) it belongs to, and whether the fabric manager finished setting it up. Raw:
    `{"cluster_uuid": "...", "clique_id": 7, "state": 3, "status": 0}` (nvmlGpuFabricState_t, nvmlReturn_t)."""
    make = getattr(ask.nvml, "c_nvmlGpuFabricInfoV_t", None)
    if make is None:  # an nvidia-ml-py without the versioned call
        return {"nvml_error": "FUNCTION_NOT_FOUND"}
    info = make()

    def read(_: Any) -> dict[str, Any]:
        return {"cluster_uuid": str(uuid.UUID(bytes=bytes(info.clusterUuid))), "clique_id": int(info.cliqueId),
                "state": int(info.state), "status": int(info.status)}

    return ask("nvmlDeviceGetGpuFabricInfoV", handle, ctypes.byref(info), convert=read)  # NVML fills the struct


def _gpu(ask: Asker, index: int, handle: Any, cpu_words: int) -> dict[str, Answer]:
    node_scope = ask.nvml.NVML_AFFINITY_SCOPE_NODE
    gpu: dict[str, Answer] = {
        "index": index,
        "name": ask("nvmlDeviceGetName", handle, convert=_text),
        "uuid": ask("nvmlDeviceGetUUID", handle, convert=_text),
        "pci_bus_id": ask("nvmlDeviceGetPciInfo", handle, convert=_bus_id),
        "memory_total": ask("nvmlDeviceGetMemoryInfo", handle, convert=lambda m: m.total),
        "cuda_compute_capability": ask("nvmlDeviceGetCudaComputeCapability", handle, convert=list),
        # the CPUs of the GPU's NUMA node, as `nvidia-smi topo -m` prints them
        "cpu_affinity": ask("nvmlDeviceGetCpuAffinityWithinScope", handle, cpu_words, node_scope, convert=list),
        "memory_affinity": ask("nvmlDeviceGetMemoryAffinity", handle, NODE_SET_WORDS, node_scope, convert=list),
        "numa_node_id": ask("nvmlDeviceGetNumaNodeId", handle),  # the GPU memory's own node on Grace
    }
    if is_error(gpu["cpu_affinity"]):  # drivers before the scoped call existed
        gpu["cpu_affinity_any_scope"] = ask("nvmlDeviceGetCpuAffinity", handle, cpu_words, convert=list)
    gpu["nvlinks"] = _nvlinks(ask, handle)
    gpu["fabric"] = _fabric(ask, handle)
    return gpu


def query_nvml(nvml: ModuleType, cpu_count: int | None = None) -> dict[str, Any]:
    """Everything NVML says about this machine's GPUs. nvmlInit must have succeeded; a failing
    nvmlDeviceGetCount propagates (no GPU list at all), any later failure is recorded as an answer."""
    ask = Asker(nvml)
    cpu_words = max(1, math.ceil((cpu_count or os.cpu_count() or 1) / 64))
    count = nvml.nvmlDeviceGetCount()
    gpus: list[dict[str, Answer]] = []
    handles: dict[int, Any] = {}
    for index in range(count):
        handle = ask("nvmlDeviceGetHandleByIndex", index)
        if is_error(handle):
            gpus.append({"index": index, "handle": handle})
            continue
        handles[index] = handle
        gpus.append(_gpu(ask, index, handle, cpu_words))
    pairs = []
    for a in range(count):
        for b in range(a + 1, count):
            if a in handles and b in handles:
                ha, hb = handles[a], handles[b]
                pairs.append({
                    "a": a, "b": b,
                    "common_ancestor": ask("nvmlDeviceGetTopologyCommonAncestor", ha, hb),
                    "p2p": {letter: ask("nvmlDeviceGetP2PStatus", ha, hb, index)
                            for letter, index in P2P_INDEXES.items()},
                })
    return {
        "driver_version": ask("nvmlSystemGetDriverVersion", convert=_text),
        "nvml_version": ask("nvmlSystemGetNVMLVersion", convert=_text),
        "cuda_driver_version": ask("nvmlSystemGetCudaDriverVersion"),
        "device_count": count,
        "gpus": gpus,
        "pairs": pairs,
    }
