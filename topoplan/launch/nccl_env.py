"""The NCCL variables a rank gets, each only when the topology gives a reason for it.

NCCL finds most things itself; we set a variable only where the graph knows better than its defaults:
- NCCL_IB_HCA: the node's GPU-facing NICs, the same list on every rank. NCCL already gives each GPU its
  nearest NIC from the NICs it may use (and PXN can route through a peer GPU's NIC), so a per-rank list
  only takes choices away; what NCCL cannot tell is which NICs carry storage or management traffic, so the
  list leaves out every NIC that is the nearest NIC of no GPU. Names are written with NCCL's `=` prefix
  (exact match): plain `mlx5_1` would also select mlx5_10..mlx5_19.
- NCCL_P2P_LEVEL: only when a `nvidia-smi topo -p2p` matrix shows peer reads or writes failing between GPUs this
  node uses, and no pair as far apart or farther reads and writes fine: P2P is then allowed only up to the level
  just closer than the closest failing link. NVLink and atomics statuses say nothing about NCCL's P2P transport
  (it copies with reads and writes; a PCIe box has no NVLink, and P2P works without atomics), and NCCL already
  skips a pair CUDA cannot access, so a level that would also turn off working pairs is not set: a note says why.
- NCCL_MNNVL_ENABLE: on a multi-node NVLink domain (GB200/GB300 NVL72), so traffic between the job's nodes
  (trays) goes over NVLink; NCCL would detect it too (default auto), the variable makes a fallback to the
  network an error instead of a silent slowdown.
RCCL (AMD) reads these same NCCL_* names; the GPU selection variables differ (launch/device_env.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations

from topoplan.topology.links import LinkKind
from topoplan.topology.model import Nic, Topology


@dataclass(frozen=True)
class EnvVar:
    """One environment variable for one rank, with the one-line reason shown by --explain and in JSON."""

    name: str
    value: str
    reason: str


# NCCL_P2P_LEVEL to use when P2P fails at this link kind: the NCCL level just closer than it. NCCL's PHB
# covers both topo -m PHB and NODE (same NUMA node, through the CPU), so failing at either stops at PXB.
_LEVEL_BELOW = {
    LinkKind.NVLINK: "LOC",
    LinkKind.XGMI: "LOC",
    LinkKind.PIX: "NVL",
    LinkKind.PXB: "PIX",
    LinkKind.PHB: "PXB",
    LinkKind.NODE: "PXB",
    LinkKind.SYS: "PHB",
}


def gpu_facing_nics(topology: Topology) -> list[Nic]:
    """NICs that are the nearest NIC of at least one GPU, in NIC order; only named ones (NCCL wants names)."""
    facing = {nic.id for gpu in topology.gpus for nic in topology.nearest_nics(gpu.id)}
    return [nic for nic in topology.nics if nic.id in facing and nic.name]


def ib_hca(topology: Topology) -> EnvVar | None:
    """NCCL_IB_HCA for every rank of a node of this topology; None when no named NIC is near a GPU."""
    facing = gpu_facing_nics(topology)
    if not facing:
        return None
    others = [nic.name or nic.id for nic in topology.nics if nic not in facing]
    names = ",".join(nic.name for nic in facing)  # type: ignore[misc]
    left_out = (f"; left out {', '.join(others)}, the nearest NIC of no GPU (storage or management)" if others
                else "")
    return EnvVar("NCCL_IB_HCA", f"={names}",
                  f"the node's GPU-facing NICs: NCCL picks each GPU's nearest one itself{left_out}; '=' makes NCCL "
                  "match these names exactly, not as prefixes")


# The `topo -p2p` tests that NCCL's P2P transport depends on: peer reads and writes (r, w). NVLink (n), atomics
# (a) and the property test (p) report features NCCL does not need for it.
P2P_DATA_TESTS = ("r", "w")


def p2p_level(topology: Topology, gpu_ids: Sequence[str]) -> tuple[EnvVar | None, list[str]]:
    """NCCL_P2P_LEVEL for ranks on a node using these GPUs, and notes: the variable only when peer reads or writes
    are known to fail between them and every pair at least as far apart fails too (else a note and no variable)."""
    failing, working = [], []
    for a, b in combinations(sorted(set(gpu_ids)), 2):
        if not topology.graph.has_edge(a, b):
            continue
        link = topology.link(a, b)
        tested = {test: status for test, status in (link.p2p or {}).items() if test in P2P_DATA_TESTS}
        bad = sorted(f"{test}={status}" for test, status in tested.items() if status.upper() != "OK")
        if bad:
            failing.append((link.kind.rank, a, b, link, bad))
        elif tested:
            working.append((link.kind.rank, a, b, link))
    if not failing:
        return None, []
    rank, a, b, link, bad = min(failing, key=lambda f: f[:3])
    farther = [w for w in working if w[0] >= rank]
    if farther:
        _, c, d, ok = min(farther, key=lambda w: w[:3])
        return None, [f"topo -p2p reports {', '.join(bad)} between {a} and {b} ({link.code}) but reads and writes "
                      f"work between {c} and {d} ({ok.code}): no NCCL_P2P_LEVEL, which would turn P2P off for both; "
                      "NCCL skips the pairs CUDA cannot access itself"]
    level = _LEVEL_BELOW[link.kind]
    return EnvVar("NCCL_P2P_LEVEL", level, f"topo -p2p reports {', '.join(bad)} between {a} and {b} ({link.code}) "
                  f"and no pair as far apart reads and writes: P2P only up to {level}"), []


def mnnvl(topology: Topology, nodes: int) -> EnvVar | None:
    """NCCL_MNNVL_ENABLE=1 when the job spans nodes and this node's GPUs are all in one multi-node NVLink domain."""
    domains = topology.fabric_domains()
    if nodes < 2 or len(domains) != 1 or len(next(iter(domains.values()))) != len(topology.gpus):
        return None
    cluster, _, clique = next(iter(domains)).partition("/")
    return EnvVar("NCCL_MNNVL_ENABLE", "1", f"the GPUs are in one multi-node NVLink domain (cluster {cluster}, "
                  f"clique {clique}): the {nodes} nodes reach each other over NVLink; fail rather than fall back to "
                  "the network")
