"""What NVML says of each NVIDIA GPU: persistence mode, NVLink links, PCIe link, retired pages, P2P status.

- Persistence mode off: the driver unloads the GPU's state when no process holds it, so every rank start pays
  the initialisation again (seconds on 8 GPUs) and the first collective times out more easily.
- An inactive NVLink on a GPU whose other links are up sends its share of traffic over PCIe or another hop.
- Pages pending retirement need a GPU reset before the memory is trusted again.
- nvmlDeviceGetP2PStatus not OK: NCCL moves that pair's traffic through host memory.
"""

from __future__ import annotations

from typing import Any

from topoplan.doctor.finding import Finding
from topoplan.doctor.nvml import SKIPPED
from topoplan.doctor.pci_ids import NVIDIA
from topoplan.topology.nvml_query import NVML_FEATURE_ENABLED, is_error


def _gpu_name(gpu: dict[str, Any]) -> str:
    return f"GPU{gpu['index']}"


def _unknown(check: str, group: str, subject: str, field: str, answer: Any) -> Finding:
    return Finding(check, group, "unknown", subject, f"{field} not known", f"NVML {field}: {answer['nvml_error']}")


def _persistence(gpu: dict[str, Any]) -> Finding | None:
    answer = gpu.get("persistence_mode")
    if answer is None:
        return None
    subject = _gpu_name(gpu)
    if is_error(answer):
        return _unknown("persistence", "peer-to-peer", subject, "nvmlDeviceGetPersistenceMode", answer)
    evidence = f"NVML nvmlDeviceGetPersistenceMode = {answer}"
    if answer != NVML_FEATURE_ENABLED:
        return Finding("persistence", "peer-to-peer", "slows", subject, "persistence mode off: every start "
                       "re-initialises the GPU", evidence, "`sudo nvidia-smi -pm 1`, or run nvidia-persistenced")
    return Finding("persistence", "peer-to-peer", "ok", subject, "persistence mode on", evidence)


def _nvlinks(gpu: dict[str, Any]) -> Finding | None:
    states = [link["state"] for link in gpu.get("nvlinks", []) if not is_error(link["state"])]
    if not states:
        return None  # no NVLink on this GPU (NVML answers NOT_SUPPORTED for link 0)
    down = [i for i, s in enumerate(states) if s != NVML_FEATURE_ENABLED]
    evidence = f"NVML nvmlDeviceGetNvLinkState links 0-{len(states) - 1} = {states}"
    if down:
        return Finding("nvlink", "peer-to-peer", "slows", _gpu_name(gpu), f"{len(down)} of {len(states)} NVLinks "
                       f"inactive (links {', '.join(map(str, down))})", evidence,
                       "`nvidia-smi nvlink -s`; reseat the bridge or check the NVSwitch fabric manager "
                       "(`systemctl status nvidia-fabricmanager`)")
    return Finding("nvlink", "peer-to-peer", "ok", _gpu_name(gpu), f"all {len(states)} NVLinks active", evidence)


def _pcie(gpu: dict[str, Any]) -> Finding | None:
    pcie = gpu.get("pcie")
    if not pcie:
        return None
    subject = _gpu_name(gpu)
    failed = [k for k, v in pcie.items() if is_error(v)]
    if failed:
        return _unknown("nvml-pcie", "peer-to-peer", subject, f"PCIe {failed[0]}", pcie[failed[0]])
    evidence = (f"NVML PCIe generation {pcie['current_generation']} (max {pcie['max_generation']}), width "
                f"x{pcie['current_width']} (max x{pcie['max_width']})")
    if pcie["current_width"] < pcie["max_width"]:
        return Finding("nvml-pcie", "peer-to-peer", "slows", subject, "PCIe link narrower than its maximum",
                       evidence, "reseat the GPU or move it to a full-width slot")
    if pcie["current_generation"] < pcie["max_generation"]:
        return Finding("nvml-pcie", "peer-to-peer", "note", subject, "PCIe generation below its maximum: idle GPUs "
                       "step down; re-check under load", evidence, "`nvidia-smi -q -d PCI` while a job runs")
    return Finding("nvml-pcie", "peer-to-peer", "ok", subject, "PCIe link at its maximum", evidence)


def _retired(gpu: dict[str, Any]) -> Finding | None:
    pages = gpu.get("retired_pages")
    if not pages:
        return None
    subject = _gpu_name(gpu)
    pending = pages.get("pending")
    if pending is None or is_error(pending):
        return None if pending is None or pending["nvml_error"] == "NOT_SUPPORTED" else \
            _unknown("retired-pages", "memory", subject, "nvmlDeviceGetRetiredPagesPendingStatus", pending)
    evidence = (f"NVML retired pages: {pages.get('single_bit_ecc')} single-bit, {pages.get('double_bit_ecc')} "
                f"double-bit; pending = {pending}")
    if pending == NVML_FEATURE_ENABLED:
        return Finding("retired-pages", "memory", "slows", subject, "pages wait for retirement: reset the GPU "
                       "before trusting its memory", evidence, "`sudo nvidia-smi -r -i INDEX` (or reboot)"
                       .replace("INDEX", str(gpu["index"])))
    double = pages.get("double_bit_ecc")
    if isinstance(double, int) and double > 0:
        return Finding("retired-pages", "memory", "note", subject, f"{double} page(s) retired after double-bit "
                       "errors", evidence, "watch the count; ask the vendor about an RMA if it grows")
    return Finding("retired-pages", "memory", "ok", subject, "no retired page pending", evidence)


def p2p_status(recording: dict[str, Any], a: int, b: int) -> tuple[str | None, str]:
    """NVML's P2P read status of GPUs a and b: ("OK" | "CNS" | ... , evidence), or (None, why not known)."""
    from topoplan.topology.recording import P2P_CODES  # the graph model under it: only where NVML answered

    nvml = recording["nvml"]
    if SKIPPED in nvml:
        return None, f"NVML: {nvml[SKIPPED]}"
    key = (min(a, b), max(a, b))
    for pair in nvml["pairs"]:
        if (pair["a"], pair["b"]) == key:
            answer = pair.get("p2p", {}).get("r")
            if answer is None or is_error(answer):
                return None, f"NVML nvmlDeviceGetP2PStatus(GPU{a}, GPU{b}, READ): {answer}"
            code = P2P_CODES.get(answer, f"code {answer}")
            return code, f"NVML nvmlDeviceGetP2PStatus(GPU{a}, GPU{b}, READ) = {answer} ({code})"
    return None, f"NVML: no answer recorded for GPU{a}-GPU{b}"


def _p2p(recording: dict[str, Any]) -> list[Finding]:
    findings = []
    for pair in recording["nvml"]["pairs"]:
        a, b = pair["a"], pair["b"]
        code, evidence = p2p_status(recording, a, b)
        subject = f"GPU{a}-GPU{b}"
        if code is None:
            findings.append(Finding("p2p", "peer-to-peer", "unknown", subject, "P2P status not known", evidence))
        elif code != "OK":
            findings.append(Finding("p2p", "peer-to-peer", "note", subject, f"no peer-to-peer ({code}): traffic "
                                    "between them goes through host memory; keep them out of one TP group",
                                    evidence, "`nvidia-smi topo -p2p r`; check ACS and the IOMMU (above)"))
    if recording["nvml"]["pairs"] and not findings:
        findings.append(Finding("p2p", "peer-to-peer", "ok", f"{len(recording['nvml']['pairs'])} GPU pairs",
                                "P2P read OK between every pair", "NVML nvmlDeviceGetP2PStatus(READ) = 0 (OK)"))
    return findings


def check(recording: dict[str, Any]) -> list[Finding]:
    nvml = recording["nvml"]
    if SKIPPED in nvml:
        nvidia = any(e["role"] == "gpu" and e["vendor"] == NVIDIA for e in recording["pci"].values())
        if not nvidia:
            return [Finding("nvml", "peer-to-peer", "ok", "NVML", "no NVIDIA GPU: the NVML checks do not apply",
                            "/sys/bus/pci/devices/*/vendor: no 0x10de GPU")]
        return [Finding("nvml", "peer-to-peer", "unknown", "NVML", "persistence, NVLink, retired pages and P2P "
                        "not known", nvml[SKIPPED], "install nvidia-ml-py and the NVIDIA driver")]
    findings = [f for gpu in nvml["gpus"] for f in (_persistence(gpu), _nvlinks(gpu), _pcie(gpu), _retired(gpu))
                if f is not None]
    return findings + _p2p(recording)
