"""`doctor --for LAYOUT`: what one layout needs of this machine, judged from its recording.

The layout is placed exactly as `topoplan launch` places it (topoplan.plan.placement.place), so the GPUs, TP
pairs, NICs and CPU bindings judged here are the ones the launch will use:
- across nodes, each of its GPUs needs a nearest NIC up (NCCL_IB_HCA names them): blocks when none is;
- every GPU pair of a TP group should have P2P (NVML's status in the recording): slows otherwise;
- /dev/shm must hold what the engine needs: blocks otherwise;
- the CPUs each rank is bound to (cpuset.split_cpus, as launch splits them) must be in this process's cpuset,
  or numactl fails at start: blocks.
Every node runs the same shape, so this machine is judged as node 0.
"""

from __future__ import annotations

from itertools import combinations
from typing import Any

from topoplan.cpuset import format_cpu_list, split_cpus
from topoplan.doctor.checks.evidence import cpus, unknown_reason
from topoplan.doctor.checks.gpu import p2p_status
from topoplan.doctor.checks.host import DEFAULT_ENGINE, shm_finding
from topoplan.doctor.checks.network import port_active
from topoplan.doctor.finding import Finding
from topoplan.doctor.readings import is_unreadable
from topoplan.errors import TopoplanError
from topoplan.layout import Layout, RankPlacement
from topoplan.topology.model import Topology


def _nic_state(recording: dict[str, Any], name: str) -> tuple[bool | None, str]:
    """(up?, evidence) of a NIC by its name in /sys/class/infiniband or /sys/class/net; None: not found."""
    device = recording["infiniband"].get(name)
    if device is not None:
        states = {n: port_active(p) for n, p in device["ports"].items()}
        evidence = "; ".join(f"/sys/class/infiniband/{name}/ports/{n}/state = {p['state']}"
                             for n, p in device["ports"].items()) or f"/sys/class/infiniband/{name}: no ports"
        if any(states.values()):
            return True, evidence
        return (None if any(s is None for s in states.values()) else False), evidence
    iface = recording["net"].get(name)
    if iface is not None:
        state = iface["operstate"]
        evidence = f"/sys/class/net/{name}/operstate = {state}"
        return (None if is_unreadable(state) else state == "up"), evidence
    return None, f"{name} is in neither /sys/class/infiniband nor /sys/class/net of this machine"


def nic_findings(recording: dict[str, Any], topology: Topology, local: list[RankPlacement],
                 nodes: int) -> list[Finding]:
    """Across nodes, each GPU's nearest NICs (NCCL_IB_HCA's list, of which NCCL picks the nearest): a NIC down
    blocks when some GPU of the layout has every other nearest NIC down too, and slows when the others carry its
    share or their state is not known (never guessed down)."""
    if nodes == 1:
        return [Finding("layout-nic", "network", "ok", "NICs", "one node: no NIC carries the layout's traffic",
                        f"--nodes {nodes}")]
    nearest = {p.gpu: [nic.name or nic.id for nic in topology.nearest_nics(p.gpu)] for p in local}
    names = list(dict.fromkeys(name for nics in nearest.values() for name in nics))
    if not names:
        return [Finding("layout-nic", "network", "unknown", "NICs", "the topology names no NIC near the layout's "
                        "GPUs", f"{topology.source or 'topology'}: no NIC linked to {local[0].gpu}")]
    states = {name: _nic_state(recording, name) for name in names}
    findings = []
    for name in names:
        up, evidence = states[name]
        gpus = sorted(g for g, nics in nearest.items() if name in nics)
        subject = f"{name} (nearest {', '.join(gpus)})"
        if up is None:
            findings.append(Finding("layout-nic", "network", "unknown", subject, "state not known", evidence))
        elif up:
            findings.append(Finding("layout-nic", "network", "ok", subject, "up", evidence))
        else:
            others = {g: [states[n][0] for n in nearest[g] if n != name] for g in gpus}
            stranded = [g for g, up_ in others.items() if all(u is False for u in up_)]  # every other NIC down
            unsure = [g for g, up_ in others.items() if not any(up_) and g not in stranded]  # others not known
            fix = f"bring {name} up (`ibstat {name}`, `ip link`), or leave it out: NCCL_IB_HCA=^{name}"
            if stranded:
                findings.append(Finding("layout-nic", "network", "blocks", subject, f"down, and ranks on "
                                        f"{', '.join(stranded)} have no other nearest NIC up for the traffic between "
                                        "nodes", evidence, fix))
            elif unsure:
                findings.append(Finding("layout-nic", "network", "slows", subject, f"down; whether "
                                        f"{', '.join(unsure)} have another nearest NIC up is not known (see their "
                                        "rows)", evidence, fix))
            else:
                findings.append(Finding("layout-nic", "network", "slows", subject, "down: its GPUs' traffic between "
                                        "nodes shares their other nearest NICs", evidence, fix))
    return findings


def p2p_findings(recording: dict[str, Any], topology: Topology, layout: Layout,
                 local: list[RankPlacement]) -> list[Finding]:
    groups: dict[tuple[int, int], list[int]] = {}
    for placement in local:
        groups.setdefault((placement.dp_rank, placement.pp_rank), []).append(topology.gpu(placement.gpu).index)
    pairs = sorted({tuple(sorted(p)) for gpus in groups.values() for p in combinations(gpus, 2)})
    if not pairs:
        return [Finding("layout-p2p", "peer-to-peer", "ok", "TP groups", f"tp={layout.tp}: no GPU pair in a TP "
                        "group on one node", str(layout))]
    findings = []
    for a, b in pairs:
        code, evidence = p2p_status(recording, a, b)
        subject = f"TP pair GPU{a}-GPU{b}"
        if code is None:
            findings.append(Finding("layout-p2p", "peer-to-peer", "unknown", subject, "P2P status not known",
                                    evidence))
        elif code != "OK":
            findings.append(Finding("layout-p2p", "peer-to-peer", "slows", subject, f"no peer-to-peer ({code}): "
                                    "every all-reduce of this TP group goes through host memory", evidence,
                                    "choose a layout whose TP groups have P2P (`topoplan plan`), or fix ACS/IOMMU"))
        else:
            findings.append(Finding("layout-p2p", "peer-to-peer", "ok", subject, "P2P OK", evidence))
    return findings


def cpu_findings(recording: dict[str, Any], topology: Topology, local: list[RankPlacement]) -> list[Finding]:
    reading = recording["cpus"]["cpus_allowed_list"]
    allowed = cpus(reading)
    if allowed is None:
        return [Finding("layout-cpus", "containers", "unknown", "bound CPUs", "this process's CPUs not known",
                        unknown_reason(reading, "a CPU list"))]
    affinity = {p.rank: topology.gpu(p.gpu).cpus for p in local}
    if any(not c for c in affinity.values()):
        return [Finding("layout-cpus", "containers", "ok", "bound CPUs", "the topology gives no CPU affinity: "
                        "launch binds no CPU", topology.source or "topology")]
    try:
        shares = split_cpus(affinity, None, where="this node")
    except TopoplanError as error:
        return [Finding("layout-cpus", "containers", "blocks", "bound CPUs", str(error), topology.source or "")]
    findings = []
    for rank, share in sorted(shares.items()):
        missing = sorted(set(share.cpus) - set(allowed))
        if missing:
            findings.append(Finding("layout-cpus", "containers", "blocks", f"rank {rank}", f"bound to CPUs "
                                    f"{format_cpu_list(share.cpus)}, of which {format_cpu_list(missing)} are outside "
                                    "this cpuset: numactl refuses to start it",
                                    f"/proc/self/status Cpus_allowed_list = {reading}",
                                    "run where the GPUs' CPUs are allowed (docker --cpuset-cpus, Slurm --cpu-bind), "
                                    "or launch without --this-machine binding"))
    if not findings:
        findings.append(Finding("layout-cpus", "containers", "ok", "bound CPUs", f"all {len(shares)} ranks' CPUs are "
                                "in this cpuset", f"/proc/self/status Cpus_allowed_list = {reading}"))
    return findings


def layout_findings(recording: dict[str, Any], topology: Topology, layout: Layout, nodes: int = 1,
                    engine: str = DEFAULT_ENGINE) -> list[Finding]:
    """What `layout` over `nodes` nodes of `topology` needs of the machine in `recording`."""
    from topoplan.plan.placement import place  # the planner: only for --for, not for a plain doctor run

    local = [p for p in place(topology, layout, nodes) if p.node == 0]
    return [*nic_findings(recording, topology, local, nodes), *p2p_findings(recording, topology, layout, local),
            shm_finding(recording, engine), *cpu_findings(recording, topology, local)]


def blocking_line(findings: list[Finding]) -> str | None:
    """The one line a launch stops with: the first finding that blocks; None when nothing does."""
    for finding in findings:
        if finding.severity == "blocks":
            fix = f"; fix: {finding.fix}" if finding.fix else ""
            return f"{finding.subject}: {finding.message} ({finding.evidence}){fix}"
    return None
