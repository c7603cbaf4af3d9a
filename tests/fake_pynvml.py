"""A stand-in for the `pynvml` module that answers from a recording, installed at the pynvml boundary
(`sys.modules["pynvml"]`) so every NVML call topoplan makes runs in CI without a GPU.

Constants and error classes are the real nvidia-ml-py ones (importing pynvml loads no driver); only the
functions are replaced. A question the recording holds no answer for fails the test (AssertionError):
the fake never invents an answer. Every call is logged in `module.calls`.
"""

from __future__ import annotations

import sys
import types
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml as real


@dataclass(frozen=True)
class FakeHandle:
    index: int


def _answer(value: Any) -> Any:
    if isinstance(value, dict) and "nvml_error" in value:
        raise real.NVMLError(getattr(real, f"NVML_ERROR_{value['nvml_error']}"))
    return value


def _need(mapping: Any, key: Any, what: str) -> Any:
    assert isinstance(mapping, (dict, list)), f"fake pynvml: no recorded answers for {what}"
    assert (key in mapping) if isinstance(mapping, dict) else (0 <= key < len(mapping)), \
        f"fake pynvml: the recording holds no answer to {what}"
    return mapping[key]


def fake_pynvml(recording: dict[str, Any], init_error: str | None = None) -> types.ModuleType:
    """A pynvml module replaying `recording["nvml"]`; `init_error` (e.g. "LIBRARY_NOT_FOUND") makes nvmlInit
    fail the way it does on a machine without the driver."""
    nvml = recording["nvml"]
    module = types.ModuleType("pynvml")
    for name, value in vars(real).items():
        if name.startswith(("NVML_", "NVMLError")) or name == "c_nvmlGpuFabricInfoV_t":
            setattr(module, name, value)
    module.calls = []

    def gpu(handle: FakeHandle) -> dict[str, Any]:
        return nvml["gpus"][handle.index]

    def field(handle: FakeHandle, key: str, function: str) -> Any:
        return _answer(_need(gpu(handle), key, f"{function}(GPU{handle.index})"))

    def link(handle: FakeHandle, number: int, key: str, function: str) -> Any:
        links = _need(gpu(handle), "nvlinks", f"{function}(GPU{handle.index})")
        entry = _need(links, number, f"{function}(GPU{handle.index}, link {number})")
        return _answer(_need(entry, key, f"{function}(GPU{handle.index}, link {number})"))

    def pair(a: FakeHandle, b: FakeHandle) -> dict[str, Any]:
        key = (min(a.index, b.index), max(a.index, b.index))
        found = [p for p in nvml["pairs"] if (p["a"], p["b"]) == key]
        assert found, f"fake pynvml: no recorded pair GPU{key[0]}-GPU{key[1]}"
        return found[0]

    def pci_info(bus_id: Any) -> Any:
        return types.SimpleNamespace(busId=bus_id.encode())  # ctypes hands char arrays over as bytes

    def fabric_info(handle: FakeHandle, pointer: Any) -> int:
        """Fill the caller's c_nvmlGpuFabricInfoV_t, passed by reference as the C call needs, from the recording."""
        info = getattr(pointer, "_obj", None)  # what ctypes.byref points at
        assert isinstance(info, real.c_nvmlGpuFabricInfoV_t), "nvmlDeviceGetGpuFabricInfoV needs byref(struct)"
        assert info.version == real.nvmlGpuFabricInfo_v2, "the struct's version field must be set"
        answer = field(handle, "fabric", "nvmlDeviceGetGpuFabricInfoV")
        info.clusterUuid[:] = uuid.UUID(answer["cluster_uuid"]).bytes
        info.cliqueId, info.state, info.status = answer["clique_id"], answer["state"], answer["status"]
        return real.NVML_SUCCESS

    def handle_by_index(index: int) -> FakeHandle:
        _answer(_need(nvml["gpus"], index, f"nvmlDeviceGetHandleByIndex({index})").get("handle"))
        return FakeHandle(index)

    def init() -> None:
        if init_error:
            raise real.NVMLError(getattr(real, f"NVML_ERROR_{init_error}"))

    def scoped(key: str, function: str, check_scope: bool = True):
        def call(handle: FakeHandle, size: int, scope: int | None = None) -> list[int]:
            assert size >= 1
            if check_scope:
                assert scope == real.NVML_AFFINITY_SCOPE_NODE, f"{function}: unexpected scope {scope}"
            return field(handle, key, function)
        return call

    functions = {
        "nvmlInit": init,
        "nvmlShutdown": lambda: None,
        "nvmlSystemGetDriverVersion": lambda: _answer(nvml["driver_version"]),
        "nvmlSystemGetNVMLVersion": lambda: _answer(nvml["nvml_version"]),
        "nvmlSystemGetCudaDriverVersion": lambda: _answer(nvml["cuda_driver_version"]),
        "nvmlDeviceGetCount": lambda: nvml["device_count"],
        "nvmlDeviceGetHandleByIndex": handle_by_index,
        "nvmlDeviceGetName": lambda h: field(h, "name", "nvmlDeviceGetName"),
        "nvmlDeviceGetUUID": lambda h: field(h, "uuid", "nvmlDeviceGetUUID"),
        "nvmlDeviceGetPciInfo": lambda h: pci_info(field(h, "pci_bus_id", "nvmlDeviceGetPciInfo")),
        "nvmlDeviceGetMemoryInfo": lambda h: types.SimpleNamespace(
            total=field(h, "memory_total", "nvmlDeviceGetMemoryInfo")),
        "nvmlDeviceGetCudaComputeCapability": lambda h: tuple(
            field(h, "cuda_compute_capability", "nvmlDeviceGetCudaComputeCapability")),
        "nvmlDeviceGetCpuAffinityWithinScope": scoped("cpu_affinity", "nvmlDeviceGetCpuAffinityWithinScope"),
        "nvmlDeviceGetCpuAffinity": scoped("cpu_affinity_any_scope", "nvmlDeviceGetCpuAffinity", check_scope=False),
        "nvmlDeviceGetMemoryAffinity": scoped("memory_affinity", "nvmlDeviceGetMemoryAffinity"),
        "nvmlDeviceGetNumaNodeId": lambda h: field(h, "numa_node_id", "nvmlDeviceGetNumaNodeId"),
        "nvmlDeviceGetNvLinkState": lambda h, n: link(h, n, "state", "nvmlDeviceGetNvLinkState"),
        "nvmlDeviceGetNvLinkVersion": lambda h, n: link(h, n, "version", "nvmlDeviceGetNvLinkVersion"),
        "nvmlDeviceGetNvLinkRemotePciInfo": lambda h, n: pci_info(
            link(h, n, "remote_pci_bus_id", "nvmlDeviceGetNvLinkRemotePciInfo")),
        "nvmlDeviceGetNvLinkRemoteDeviceType": lambda h, n: link(
            h, n, "remote_device_type", "nvmlDeviceGetNvLinkRemoteDeviceType"),
        "nvmlDeviceGetGpuFabricInfoV": fabric_info,
        "nvmlDeviceGetPersistenceMode": lambda h: field(h, "persistence_mode", "nvmlDeviceGetPersistenceMode"),
        **{function: (lambda key, function: lambda h: _answer(_need(
            field(h, "pcie", function), key, f"{function}(GPU{h.index})")))(key, function)
           for function, key in (("nvmlDeviceGetCurrPcieLinkGeneration", "current_generation"),
                                 ("nvmlDeviceGetMaxPcieLinkGeneration", "max_generation"),
                                 ("nvmlDeviceGetCurrPcieLinkWidth", "current_width"),
                                 ("nvmlDeviceGetMaxPcieLinkWidth", "max_width"))},
        # the recording keeps the count; NVML returns the pages' addresses, so hand back that many
        "nvmlDeviceGetRetiredPages": lambda h, cause: [0] * _answer(_need(
            field(h, "retired_pages", "nvmlDeviceGetRetiredPages"), ("single_bit_ecc", "double_bit_ecc")[cause],
            f"nvmlDeviceGetRetiredPages(GPU{h.index}, {cause})")),
        "nvmlDeviceGetRetiredPagesPendingStatus": lambda h: _answer(_need(
            field(h, "retired_pages", "nvmlDeviceGetRetiredPagesPendingStatus"), "pending",
            f"nvmlDeviceGetRetiredPagesPendingStatus(GPU{h.index})")),
        "nvmlDeviceGetTopologyCommonAncestor": lambda a, b: _answer(pair(a, b)["common_ancestor"]),
        "nvmlDeviceGetP2PStatus": lambda a, b, index: _answer(
            pair(a, b)["p2p"]["rwnap"[index]]),
    }

    def logged(name: str, function: Any) -> Any:
        def call(*args: Any) -> Any:
            module.calls.append(name)
            return function(*args)
        return call

    for name, function in functions.items():
        assert hasattr(real, name), f"fake pynvml defines {name}, which nvidia-ml-py does not have"
        setattr(module, name, logged(name, function))
    return module


def install(monkeypatch: Any, module: types.ModuleType | None) -> None:
    """Put `module` where `import pynvml` finds it (None: make the import fail, as without nvidia-ml-py), and
    hide this host's /proc/cpuinfo from the recorder: the fake machine's CPU is the recording's, not ours."""
    monkeypatch.setitem(sys.modules, "pynvml", module)
    monkeypatch.setattr("topoplan.topology.nvml_reader.CPUINFO", Path("/nonexistent/cpuinfo"))
