"""The NVML part of a doctor recording: topoplan's usual NVML answers (topology.nvml_query) plus what the
doctor judges per GPU: persistence mode, PCIe link generation and width (current and max), retired pages.

NVML is optional: without nvidia-ml-py or a driver the part says why, and every NVML check says "unknown".
Answers stay raw (a value, or {"nvml_error": NAME}) as in topology recordings.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from topoplan.topology.nvml_query import Asker, is_error, query_nvml

SKIPPED = "skipped"  # {"skipped": "why"}: the part holds no NVML answers
RETIRED_CAUSES = {"single_bit_ecc": 0, "double_bit_ecc": 1}  # nvmlPageRetirementCause_t


def _doctor_fields(ask: Asker, handle: Any) -> dict[str, Any]:
    return {
        "persistence_mode": ask("nvmlDeviceGetPersistenceMode", handle),
        "pcie": {
            "current_generation": ask("nvmlDeviceGetCurrPcieLinkGeneration", handle),
            "max_generation": ask("nvmlDeviceGetMaxPcieLinkGeneration", handle),
            "current_width": ask("nvmlDeviceGetCurrPcieLinkWidth", handle),
            "max_width": ask("nvmlDeviceGetMaxPcieLinkWidth", handle),
        },
        "retired_pages": {
            **{cause: ask("nvmlDeviceGetRetiredPages", handle, code, convert=len)
               for cause, code in RETIRED_CAUSES.items()},
            "pending": ask("nvmlDeviceGetRetiredPagesPendingStatus", handle),
        },
    }


def read_nvml(nvml: ModuleType | None) -> dict[str, Any]:
    """NVML's answers for every GPU, or {"skipped": why} without nvidia-ml-py or a driver."""
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            return {SKIPPED: "the nvidia-ml-py package is not installed (pip install nvidia-ml-py)"}
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as error:
        return {SKIPPED: f"NVML could not start ({error}): no NVIDIA driver loaded here"}
    try:
        answers = query_nvml(nvml)
        ask = Asker(nvml)
        for gpu in answers["gpus"]:
            handle = ask("nvmlDeviceGetHandleByIndex", gpu["index"])
            if not is_error(handle):
                gpu.update(_doctor_fields(ask, handle))
        return answers
    except nvml.NVMLError as error:
        return {SKIPPED: f"NVML could not list the GPUs ({error})"}
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass  # the answers are in; a failing shutdown changes none of them
