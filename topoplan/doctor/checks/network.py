"""Network: RDMA ports (state, rate, link layer), Ethernet interfaces, and RLIMIT_MEMLOCK, which RDMA needs.

An InfiniBand port that is down or trained at a lower rate than its peers makes NCCL skip the rail or run the
whole ring at the slow port's pace. RDMA pins (registers) the memory it sends from; a low `ulimit -l` makes the
registration fail (NCCL: "ibv_reg_mr failed"), which is why the NCCL and SGLang containers run with
`--ulimit memlock=-1`.
"""

from __future__ import annotations

from typing import Any

from topoplan.doctor.checks.evidence import number, unknown_reason
from topoplan.doctor.finding import Finding
from topoplan.doctor.readings import is_unreadable

ACTIVE = "ACTIVE"  # /sys/class/infiniband/DEV/ports/N/state: "4: ACTIVE"


def port_active(port: dict[str, Any]) -> bool | None:
    """True when the port is ACTIVE, False when it is not, None when its state is unreadable."""
    state = port["state"]
    return None if is_unreadable(state) else state.split(":")[-1].strip() == ACTIVE


def _port(device: str, number_: str, port: dict[str, Any], best_rate: float | None) -> Finding:
    subject = f"{device} port {number_}"
    base = f"/sys/class/infiniband/{device}/ports/{number_}"
    evidence = (f"{base}/state = {port['state']}; phys_state = {port['phys_state']}; rate = {port['rate']}; "
                f"link_layer = {port['link_layer']}")
    active = port_active(port)
    if active is None:
        return Finding("rdma-port", "network", "unknown", subject, "port state not known",
                       unknown_reason(port["state"], "a port state"))
    if not active:
        return Finding("rdma-port", "network", "slows", subject, "port not ACTIVE: NCCL leaves it out, and a "
                       "layout that needs it across nodes cannot start", evidence,
                       f"check the cable and switch port (`ibstat {device}`, `ibv_devinfo -d {device}`); to leave the "
                       f"port out on purpose, NCCL_IB_HCA=^{device}")
    rate = number(port["rate"])
    if rate is not None and best_rate is not None and rate < best_rate:
        return Finding("rdma-port", "network", "slows", subject, f"rate {port['rate']} below the best port's "
                       f"{best_rate:g} Gb/s: rings across nodes run at the slowest rail", evidence,
                       f"check the cable and the switch port's speed (`ibstat {device}`)")
    if port["link_layer"] == "Ethernet":
        return Finding("rdma-port", "network", "note", subject, "RoCE (RDMA over Ethernet): needs a lossless "
                       "network (PFC/ECN) and the right GID", evidence,
                       "set NCCL_IB_GID_INDEX to the RoCE v2 GID (`show_gids`)")
    return Finding("rdma-port", "network", "ok", subject, "port ACTIVE", evidence)


def check_rdma(recording: dict[str, Any]) -> list[Finding]:
    devices = recording["infiniband"]
    if not devices:
        return [Finding("rdma-port", "network", "note", "RDMA", "no RDMA devices: traffic between nodes goes over "
                        "TCP sockets", "/sys/class/infiniband: absent or empty")]
    rates = [number(p["rate"]) for d in devices.values() for p in d["ports"].values() if port_active(p)]
    best = max((r for r in rates if r is not None), default=None)
    return [_port(name, n, port, best) for name, device in devices.items() for n, port in device["ports"].items()]


def check_net(recording: dict[str, Any]) -> list[Finding]:
    """Interfaces backed by a PCI device (virtual ones are skipped): up or not, and at what speed."""
    findings = []
    for name, iface in recording["net"].items():
        if iface["pci_address"] is None:
            continue
        evidence = (f"/sys/class/net/{name}/operstate = {iface['operstate']}; speed = {iface['speed']} Mb/s; "
                    f"device {iface['pci_address']}")
        if iface["operstate"] == "up":
            findings.append(Finding("net-link", "network", "ok", name, "interface up", evidence))
        elif is_unreadable(iface["operstate"]):
            findings.append(Finding("net-link", "network", "unknown", name, "interface state not known",
                                    unknown_reason(iface["operstate"], "a state")))
        else:
            findings.append(Finding("net-link", "network", "note", name, f"interface {iface['operstate']}: a launch "
                                    "that uses it (NCCL_SOCKET_IFNAME, the rendezvous address) will not connect",
                                    evidence, f"`ip link set {name} up`, or check its cable"))
    return findings


def check_memlock(recording: dict[str, Any]) -> list[Finding]:
    soft = recording["memlock"]["soft"]
    evidence = f"getrlimit(RLIMIT_MEMLOCK) = {soft} (hard {recording['memlock']['hard']})"
    if soft == "unlimited":
        return [Finding("memlock", "network", "ok", "ulimit -l", "locked memory unlimited", evidence)]
    if recording["infiniband"]:
        return [Finding("memlock", "network", "slows", "ulimit -l", f"only {soft} bytes may be pinned: RDMA memory "
                        "registration fails (NCCL: ibv_reg_mr failed) and traffic falls back or stops", evidence,
                        "`ulimit -l unlimited` (limits.conf: `* - memlock unlimited`; Docker: --ulimit memlock=-1; "
                        "Slurm: PropagateResourceLimits)")]
    return [Finding("memlock", "network", "ok", "ulimit -l", "limited, but no RDMA device here needs more", evidence)]
