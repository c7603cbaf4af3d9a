"""Every check of `topoplan doctor`, in the order the table shows them. A check takes the recording (a plain
dict, already shape-checked) and returns findings; none reads the live system."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from topoplan.doctor.checks import gpu, host, network, p2p, pcie
from topoplan.doctor.finding import Finding

Check = Callable[[dict[str, Any]], list[Finding]]
CHECKS: tuple[Check, ...] = (
    pcie.check, p2p.check_acs, p2p.check_iommu, gpu.check,  # peer-to-peer
    network.check_rdma, network.check_net, network.check_memlock,  # network
    host.check_numa_balancing, host.check_shm, host.check_governors, host.check_cpuset,  # memory, CPU, containers
)


def run_checks(recording: dict[str, Any]) -> list[Finding]:
    return [finding for check in CHECKS for finding in check(recording)]
