"""The host around the GPUs: NUMA auto-balancing, /dev/shm, cpufreq governors and this process's cpuset.

- NUMA balancing unmaps pages to sample who uses them; AMD's MI300X guide says to turn it off (GPU hangs), and
  NVIDIA's CUDA best-practices guide says to bind instead of letting the kernel move memory.
- /dev/shm: NCCL's shared-memory transport and the engines' worker processes (vLLM, SGLang, PyTorch's
  multiprocessing) allocate there; Docker's default is 64 MiB. Needs per engine: SHM_NEED_BYTES.
- A `powersave` governor (acpi-cpufreq) keeps cores slow; the host-side launch and copy threads pay for it.
- A cgroup cpuset narrower than the GPUs' CPU affinity leaves ranks no CPU near their GPU.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from topoplan.cpuset import format_cpu_list
from topoplan.doctor.checks.evidence import cpus, devices, gib, pci_file, unknown_reason
from topoplan.doctor.finding import Finding
from topoplan.doctor.pci_ids import AMD
from topoplan.doctor.readings import is_unreadable, why_unreadable

# /dev/shm an engine needs, with where that figure comes from (docs/doctor.md).
SHM_NEED_BYTES = {
    # NCCL's troubleshooting guide ("Shared memory"): too little /dev/shm and NCCL fails to initialise; in Docker
    # run with --shm-size=1g. PyTorch's tutorials CI crashed in ncclShmOpen under Docker's 64 MiB (pytorch/tutorials
    # 0ba3e39). The bundled runner's CPU collectives take 16 MiB per rank (runner/shm.py), well inside.
    "topoplan": 2**30,
    "vllm": 2**30,  # vLLM's Docker docs: --ipc=host or --shm-size (PyTorch shares tensors there for TP); no figure
    "trtllm": 2**30,  # TensorRT-LLM's containers: likewise --ipc=host; NCCL's floor
    "sglang": 32 * 2**30,  # SGLang's Docker instructions: --shm-size 32g
}
DEFAULT_ENGINE = "topoplan"
# cpufreq drivers whose `powersave` is a hardware-managed policy (HWP/CPPC), not "lowest clock".
MANAGED_DRIVERS = ("intel_pstate", "amd-pstate-epp", "amd-pstate")


def check_numa_balancing(recording: dict[str, Any]) -> list[Finding]:
    value = recording["numa_balancing"]
    evidence = f"/proc/sys/kernel/numa_balancing = {value}"
    if is_unreadable(value):
        return [Finding("numa-balancing", "memory", "unknown", "NUMA balancing", "not known", why_unreadable(value))]
    if value.strip() == "0":
        return [Finding("numa-balancing", "memory", "ok", "NUMA balancing", "off", evidence)]
    amd = any(e["vendor"] == AMD for _, e in devices(recording, "gpu"))
    fix = "`sudo sysctl kernel.numa_balancing=0` (persist in /etc/sysctl.d/)"
    if amd:
        return [Finding("numa-balancing", "memory", "blocks", "NUMA balancing", "on, with AMD GPUs: AMD says MI300X "
                        "GPUs can hang with NUMA auto-balancing on", evidence, fix)]
    return [Finding("numa-balancing", "memory", "slows", "NUMA balancing", "on: the kernel unmaps and migrates pages "
                    "under bound ranks (page faults, jitter)", evidence, fix)]


def shm_finding(recording: dict[str, Any], engine: str = DEFAULT_ENGINE) -> Finding:
    """/dev/shm against what `engine` needs: blocks below it."""
    shm, need = recording["shm"], SHM_NEED_BYTES[engine]
    if is_unreadable(shm):
        return Finding("shm", "containers", "unknown", "/dev/shm", "size not known", why_unreadable(shm))
    evidence = f"statvfs(/dev/shm): {gib(shm['total_bytes'])} total, {gib(shm['free_bytes'])} free"
    if shm["free_bytes"] < need:
        return Finding("shm", "containers", "blocks", "/dev/shm", f"{gib(shm['free_bytes'])} free, below the "
                       f"{gib(need)} {engine} needs: NCCL's shared-memory transport and the engine's workers fail",
                       evidence, f"Docker: --ipc=host or --shm-size={need // 2**30}g; Kubernetes: an emptyDir "
                       "with medium: Memory at /dev/shm; else free space in /dev/shm")
    return Finding("shm", "containers", "ok", "/dev/shm", f"{gib(shm['free_bytes'])} free, at least the "
                   f"{gib(need)} {engine} needs", evidence)


def check_shm(recording: dict[str, Any]) -> list[Finding]:
    return [shm_finding(recording)]


def check_governors(recording: dict[str, Any]) -> list[Finding]:
    governors, driver = recording["cpus"]["governors"], recording["cpus"]["scaling_driver"]
    readable = {cpu: g for cpu, g in governors.items() if not is_unreadable(g)}
    if not readable:
        why = why_unreadable(next(iter(governors.values()), driver)) or "no CPUs listed"
        return [Finding("cpufreq", "CPU", "unknown", "CPU governor", "not known (a VM, or no cpufreq driver: the "
                        "hypervisor or firmware sets the clocks)", why)]
    by_governor: dict[str, list[int]] = defaultdict(list)
    for cpu, governor in readable.items():
        by_governor[governor].append(int(cpu))
    findings = []
    for governor, members in sorted(by_governor.items()):
        subject = f"CPUs {format_cpu_list(members)}"
        evidence = f"/sys/devices/system/cpu/cpuN/cpufreq/scaling_governor = {governor}; scaling_driver = {driver}"
        if governor != "powersave":
            findings.append(Finding("cpufreq", "CPU", "ok", subject, f"governor {governor}", evidence))
        elif driver in MANAGED_DRIVERS:
            findings.append(Finding("cpufreq", "CPU", "note", subject, f"governor powersave under {driver}: the "
                                    "hardware picks the clock, biased to save power", evidence,
                                    "`sudo cpupower frequency-set -g performance` for steady step times"))
        else:
            findings.append(Finding("cpufreq", "CPU", "slows", subject, "governor powersave: cores stay at their "
                                    "lowest clock", evidence, "`sudo cpupower frequency-set -g performance`"))
    return findings


def check_cpuset(recording: dict[str, Any]) -> list[Finding]:
    """The process's cpuset against the online CPUs (containers) and against every GPU's CPU affinity (CPU)."""
    allowed_reading, online_reading = recording["cpus"]["cpus_allowed_list"], recording["cpus"]["online"]
    allowed, online = cpus(allowed_reading), cpus(online_reading)
    if allowed is None:
        return [Finding("cpuset", "containers", "unknown", "cpuset", "this process's CPUs not known",
                        unknown_reason(allowed_reading, "a CPU list"))]
    evidence = f"/proc/self/status Cpus_allowed_list = {allowed_reading}; /sys/devices/system/cpu/online = " \
               f"{online_reading}"
    findings = []
    if online is not None and set(allowed) < set(online):
        findings.append(Finding("cpuset", "containers", "note", "cpuset", f"this process may use {len(allowed)} of "
                                f"{len(online)} online CPUs (a cgroup cpuset or taskset)", evidence,
                                "give the container the GPUs' CPUs (docker --cpuset-cpus, Slurm --cpu-bind, k8s "
                                "static CPU manager)"))
    else:
        findings.append(Finding("cpuset", "containers", "ok", "cpuset", f"all {len(allowed)} online CPUs usable",
                                evidence))
    for address, entry in devices(recording, "gpu"):
        near = cpus(entry["local_cpulist"])
        where = f"{pci_file(address, 'local_cpulist')} = {entry['local_cpulist']}; Cpus_allowed_list = " \
                f"{allowed_reading}"
        if not near:
            findings.append(Finding("gpu-affinity", "CPU", "unknown", f"GPU {address}", "CPU affinity not known",
                                    unknown_reason(entry["local_cpulist"], "a CPU list")))
            continue
        inside = set(near) & set(allowed)
        if not inside:
            findings.append(Finding("gpu-affinity", "CPU", "slows", f"GPU {address}", "none of the GPU's CPUs are in "
                                    "this cpuset: its ranks run across the socket", where,
                                    "widen the cpuset to the GPU's CPUs (see the containers note)"))
        elif len(inside) < len(near):
            findings.append(Finding("gpu-affinity", "CPU", "note", f"GPU {address}", f"{len(inside)} of the GPU's "
                                    f"{len(near)} CPUs are in this cpuset", where))
        else:
            findings.append(Finding("gpu-affinity", "CPU", "ok", f"GPU {address}", "all the GPU's CPUs are usable",
                                    where))
    return findings
