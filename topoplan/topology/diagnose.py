"""Warnings about what in a machine's topology will hurt a multi-GPU job, each with a reason and a remedy.

Structured (a code, one-line message and advice, the devices concerned) so that the table, the JSON and
the planner can all show them.
"""

from __future__ import annotations

from dataclasses import dataclass

from topoplan.topology.links import LinkKind
from topoplan.topology.model import Topology

# `nvidia-smi topo -p2p` legend. Capabilities whose failure matters to NCCL/torch: read, write and
# "prop" (P2P as a whole), and a matrix whose mode the file did not name ("?"); NVLink P2P only where the
# pair is NVLink-connected. Atomics are not used.
P2P_STATUS = {
    "CNS": "chipset not supported",
    "GNS": "GPU not supported",
    "TNS": "topology not supported",
    "NS": "not supported",
    "U": "unknown",
    "DR": "disabled by regkey",
}
P2P_CAPABILITY = {"r": "read", "w": "write", "p": "P2P", "n": "NVLink P2P", "?": "P2P (mode not named)"}


@dataclass(frozen=True)
class Warning:
    """One problem: a stable `code` for tools, a one-line `message` (what), `advice` (what to do)."""

    code: str
    message: str
    advice: str
    devices: tuple[str, ...]
    max_tp: int | None = None  # the largest TP group the advice allows (plan says why when it ranks a larger one)

    def as_dict(self) -> dict:
        return {"code": self.code, "message": self.message, "advice": self.advice, "devices": list(self.devices)}


def _names(ids: list[str] | tuple[str, ...]) -> str:
    return ", ".join(ids)


def _nic_across_sys(topo: Topology) -> list[Warning]:
    far = [g.id for g in topo.gpus if (nics := topo.nearest_nics(g.id))
           and topo.link(g.id, nics[0].id).kind is LinkKind.SYS]
    if not far:
        return []
    return [Warning(
        "nic-across-sys",
        f"{_names(far)}: nearest NIC is across SYS (the link between CPU sockets)",
        "inter-node traffic from these GPUs crosses sockets and loses GPUDirect RDMA; use a NIC on the "
        "same socket/PCIe switch, or keep inter-node ranks off these GPUs",
        tuple(far),
    )]


def _p2p_not_ok(topo: Topology) -> list[Warning]:
    bad: dict[str, list[str]] = {}
    for link in topo.links():
        if not link.p2p or not all(topo.graph.nodes[d]["kind"] == "gpu" for d in (link.a, link.b)):
            continue
        for cap, status in sorted(link.p2p.items()):
            if status == "OK" or cap not in P2P_CAPABILITY:
                continue
            if cap == "n" and link.kind is not LinkKind.NVLINK:
                continue  # no NVLink between them: NVLink P2P is rightly unsupported
            pair = f"{link.a}-{link.b}"
            bad.setdefault(pair, []).append(f"{P2P_CAPABILITY[cap]} {status} ({P2P_STATUS.get(status, status)})")
    if not bad:
        return []
    detail = "; ".join(f"{pair}: {', '.join(what)}" for pair, what in bad.items())
    devices = sorted({d for pair in bad for d in pair.split("-")}, key=lambda d: topo.gpu(d).index)
    return [Warning(
        "p2p-not-ok",
        f"GPU peer-to-peer is not available between some pairs: {detail}",
        "NCCL falls back to copies through host memory on these pairs (much slower); check IOMMU/ACS "
        "settings and the driver, or keep tensor-parallel groups off these pairs",
        tuple(devices),
    )]


def _nvlink_shape(topo: Topology) -> list[Warning]:
    islands = topo.nvlink_islands()
    if not islands:
        return []
    warnings = []
    in_island = {g for island in islands for g in island}
    lone = [g.id for g in topo.gpus if g.id not in in_island]
    sizes = [len(island) for island in islands]
    listed = "; ".join(_names(island) for island in islands)
    if len(set(sizes)) > 1 or lone:
        extra = f"; without NVLink: {_names(lone)}" if lone else ""
        warnings.append(Warning(
            "nvlink-unequal-islands",
            f"NVLink islands of unequal size: {listed}{extra}",
            "groups spanning islands run at PCIe speed and equal groups cannot all fit inside islands; "
            "size tensor-parallel groups to the smallest island, or leave GPUs idle",
            tuple(g.id for g in topo.gpus), min(sizes) if not lone else 1,
        ))
    elif len(islands) > 1:
        warnings.append(Warning(
            "nvlink-split",
            f"NVLink joins only islands of {sizes[0]} GPUs: {listed}",
            f"keep each tensor-parallel group inside one island (TP <= {sizes[0]}); use pipeline or data "
            "parallelism across islands, whose traffic goes over PCIe",
            tuple(g for island in islands for g in island), sizes[0],
        ))
    for island in islands:
        if topo.is_full_mesh(island):
            continue
        cliques = [c for c in topo.nvlink_cliques() if set(c) <= set(island)]
        biggest = max(len(c) for c in cliques)
        groups = "; ".join(_names(c) for c in cliques if len(c) == biggest)
        warnings.append(Warning(
            "nvlink-partial-mesh",
            f"{_names(island)} are joined by NVLink but not every pair directly; all-to-all groups: {groups}",
            f"a tensor-parallel group of more than {biggest} GPUs here has pairs without a direct NVLink; "
            f"prefer groups of at most {biggest} from the list, or a ring order that only uses NVLink hops",
            tuple(island), biggest,
        ))
    return warnings


def _no_cpu_affinity(topo: Topology) -> list[Warning]:
    missing = [g.id for g in topo.gpus if not g.cpus]
    if not missing:
        return []
    return [Warning(
        "no-cpu-affinity",
        f"{_names(missing)}: no CPU affinity reported",
        "topoplan cannot bind these ranks to the GPU's own CPU cores; check the driver (a VM or container "
        "may hide it), or pass bindings by hand",
        tuple(missing),
    )]


def _memory_numa(topo: Topology) -> list[Warning]:
    gpus = [g for g in topo.gpus if g.gpu_numa_id is not None]
    if not gpus:
        return []
    nodes = ", ".join(f"{g.id} memory = NUMA node {g.gpu_numa_id}" for g in gpus)
    return [Warning(
        "gpu-memory-numa-node",
        f"GPU memory appears as memory-only NUMA nodes ({nodes})",
        "bind CPUs to the GPU's CPU NUMA node (NUMA Affinity), not to the memory-only node; "
        "`numactl --cpunodebind` on a node without CPUs fails, and --membind there puts host data in GPU memory",
        tuple(g.id for g in gpus),
    )]


def _gpu_errors(topo: Topology) -> list[Warning]:
    return [Warning(
        "gpu-error",
        f"{g.id}: {g.error}",
        "check `nvidia-smi -q` and the kernel log (dmesg: Xid errors); a GPU that fell off the bus needs a reset "
        "or a reboot; keep it out of CUDA_VISIBLE_DEVICES until then",
        (g.id,),
    ) for g in topo.gpus if g.error]


CHECKS = (_gpu_errors, _nic_across_sys, _p2p_not_ok, _nvlink_shape, _no_cpu_affinity, _memory_numa)


def diagnose(topo: Topology) -> list[Warning]:
    """Every warning for this topology, in a fixed order (broken GPUs, NICs, P2P, NVLink, CPU affinity, NUMA)."""
    return [warning for check in CHECKS for warning in check(topo)]
