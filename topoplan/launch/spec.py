"""The launch spec: for every rank, where it runs, what it sees and what it is bound to, with reasons.

Built from (topology, layout, placements) alone, so it does not care how the placement was chosen. The
renderers (torchrun, mpirun, srun/sbatch, shell, json) only format this; every decision is made here.

GPU numbering: nvidia-smi and NVML number GPUs in PCI bus order, CUDA by default "fastest first". Every
rank gets CUDA_DEVICE_ORDER=PCI_BUS_ID, and CUDA_VISIBLE_DEVICES lists the node's planned GPUs in
local-rank order, so local rank i's `cuda:i` is exactly the GPU the planner chose (torchrun-style code
that calls `set_device(LOCAL_RANK)` lands on the right GPU, and each TP group on its planned GPUs). On AMD
GPUs HIP_VISIBLE_DEVICES does the same (launch/device_env.py).

A `device="cpu"` spec runs every rank on CPUs alone (the runner over gloo): its "GPUs" are CPU slots
(topoplan.launch.cpu_slots), and no CUDA or NCCL variable and no GPU request is emitted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from topoplan.cpuset import GOMP_SPIN_COUNT, CpuFacts, format_cpu_list, split_cpus
from topoplan.errors import TopoplanError
from topoplan.launch.binding import DEFAULT_MEM_POLICY, MEM_POLICIES, check_mem_policy, cpu_source, memory_node
from topoplan.launch.device_env import device_env
from topoplan.launch.launcher_options import LauncherOptions
from topoplan.launch.nccl_env import EnvVar, ib_hca, mnnvl, p2p_level, roce_gid_index
from topoplan.layout import Layout, RankGrid, RankPlacement, check_nodes
from topoplan.rank_env import DEFAULT_MASTER_PORT
from topoplan.topology.model import Topology
from topoplan.vendors import vendor_of

# Variables every launcher sets by itself (torchrun, Open MPI, Slurm under their own names): renderers for
# those launchers leave them out so the launcher stays the one source of truth.
LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
RENDEZVOUS_VARS = ("MASTER_ADDR", "MASTER_PORT")
DEVICES = ("gpu", "cpu")  # where ranks compute: their GPUs, or CPUs alone (--device cpu)


def check_device(device: str) -> str:
    if device not in DEVICES:
        raise TopoplanError(f"--device {device!r}: expected one of {', '.join(DEVICES)}")
    return device


@dataclass(frozen=True)
class RankSpec:
    """One rank: its place, its GPU, its binding and its environment."""

    rank: int
    node: int
    local_rank: int
    tp_rank: int
    pp_rank: int
    dp_rank: int
    gpu: str  # "GPU5": nvidia-smi / NVML id
    gpu_index: int  # nvidia-smi index = PCI bus order
    pci_bus_id: str | None
    uuid: str | None
    cuda_index: int  # the rank's device inside its node's CUDA_VISIBLE_DEVICES (= local_rank)
    cpus: tuple[int, ...] | None  # None: no CPU list known (see cpu_node)
    physical_cores: int | None
    mem_node: int | None  # None: allocate local to the bound CPUs
    mem_reason: str
    env: tuple[EnvVar, ...]
    cpu_node: int | None = None  # with cpus None: bind to this NUMA node's CPUs; both None: not CPU-bound
    cpu_reason: str = ""
    mem_policy: str = DEFAULT_MEM_POLICY  # a key of topoplan.launch.binding.MEM_POLICIES

    def env_dict(self, skip: Sequence[str] = ()) -> dict[str, str]:
        return {v.name: v.value for v in self.env if v.name not in skip}

    def reasons(self) -> dict[str, str]:
        return {v.name: v.reason for v in self.env}

    def binding_argv(self) -> list[str]:
        """`numactl ... --` to put in front of the command; [] when there is nothing to bind. `--mem-policy none`
        sets no memory policy, so no numactl at all: `taskset -c CPUS` (util-linux, on every Linux host) binds
        the rank's CPUs alone."""
        if MEM_POLICIES[self.mem_policy][0] is None:
            return ["taskset", "-c", format_cpu_list(self.cpus)] if self.cpus else []
        argv = []
        if self.cpus is not None:
            argv.append(f"--physcpubind={format_cpu_list(self.cpus)}")
        elif self.cpu_node is not None:
            argv.append(f"--cpunodebind={self.cpu_node}")
        option = MEM_POLICIES[self.mem_policy][0]
        if option is not None and self.mem_node is not None:
            argv.append(f"{option}={self.mem_node}")
        elif option is not None and argv:
            argv.append("--localalloc")
        return ["numactl", *argv, "--"] if argv else []


@dataclass(frozen=True)
class NodeSpec:
    """One host and the ranks it runs, in local-rank order."""

    index: int
    host: str | None
    ranks: tuple[int, ...]
    cuda_visible_devices: str


@dataclass(frozen=True)
class LaunchSpec:
    layout: Layout
    ranks: tuple[RankSpec, ...]
    nodes: tuple[NodeSpec, ...]
    command: tuple[str, ...]
    master_addr: str | None  # None: decided at run time (Slurm: the allocation's first node)
    master_port: int
    gpus_per_node: int  # GPUs of the machine (a Slurm job asks for all of them); 0 for a CPU launch
    notes: tuple[str, ...]
    device: str = "gpu"  # "gpu", or "cpu": ranks on CPUs alone, no CUDA/NCCL variables, no GPU requests
    launcher: LauncherOptions = LauncherOptions()
    vendor: str | None = None  # the GPUs' vendor (topoplan.vendors), None: NVIDIA's or a CPU launch

    @property
    def world(self) -> int:
        return len(self.ranks)

    def node_ranks(self, node: int) -> list[RankSpec]:
        return [self.ranks[r] for r in self.nodes[node].ranks]

    def rank_argv(self, rank: RankSpec) -> list[str]:
        """What this rank executes: binding, then the command."""
        return [*rank.binding_argv(), *self.command]


def _check_placements(topology: Topology, layout: Layout, placements: Sequence[RankPlacement],
                      nodes: int) -> list[RankPlacement]:
    source = topology.source or None
    per_node = len(topology.gpus)
    if layout.world > nodes * per_node:
        raise TopoplanError(f"layout {layout} needs {layout.world} GPUs, but {nodes} node(s) of this topology "
                            f"have {nodes * per_node} ({per_node} per node)", source=source)
    by_rank = sorted(placements, key=lambda p: p.rank)
    if [p.rank for p in by_rank] != list(range(layout.world)):
        raise TopoplanError(f"placement covers ranks {[p.rank for p in by_rank]}, expected each of "
                            f"0..{layout.world - 1} exactly once for {layout}")
    seen: dict[tuple[int, str], int] = {}
    grid = RankGrid(layout)
    for p in by_rank:
        if not 0 <= p.node < nodes:
            raise TopoplanError(f"rank {p.rank} is placed on node {p.node}, but there are {nodes} node(s)")
        topology.gpu(p.gpu)
        if (p.node, p.gpu) in seen:
            raise TopoplanError(f"ranks {seen[p.node, p.gpu]} and {p.rank} are both placed on {p.gpu} of node "
                                f"{p.node}")
        seen[p.node, p.gpu] = p.rank
        c = grid.coords(p.rank)
        if (c.tp_rank, c.pp_rank, c.dp_rank) != (p.tp_rank, p.pp_rank, p.dp_rank):
            raise TopoplanError(f"rank {p.rank} is placed as tp={p.tp_rank},pp={p.pp_rank},dp={p.dp_rank}, but "
                                f"rank order puts it at tp={c.tp_rank},pp={c.pp_rank},dp={c.dp_rank}")
    return by_rank


def check_hosts(hosts: Sequence[str], nodes: int) -> tuple[str, ...]:
    """One distinct, printable host name per node: a host named twice would run two nodes' ranks on one
    machine, on the same GPUs."""
    hosts = tuple(hosts)
    for host in hosts:
        if not host or any(ord(ch) < 32 or ord(ch) == 127 for ch in host):
            raise TopoplanError(f"host name {host!r}: expected a non-empty name without control characters")
    if len(hosts) != nodes:
        raise TopoplanError(f"host list {','.join(hosts)!r} names {len(hosts)} host(s), but the plan uses {nodes} "
                            "node(s): give one host name per node")
    twice = sorted({h for h in hosts if hosts.count(h) > 1})
    if twice:
        raise TopoplanError(f"host list {','.join(hosts)!r} names {', '.join(twice)} more than once: each node is "
                            "a different machine (two loopback nodes: 127.0.0.1,127.0.0.2)")
    return hosts


def _resolve_hosts(hosts: Sequence[str] | None, nodes: int, rank0_node: int) -> tuple[tuple[str | None, ...],
                                                                                       str | None]:
    """Host per node, and the rendezvous address: the host of rank 0, which serves the store."""
    if hosts is None:
        return (None,) * nodes, ("127.0.0.1" if nodes == 1 else None)
    hosts = check_hosts(hosts, nodes)
    return hosts, hosts[rank0_node]


def build_spec(
    topology: Topology,
    layout: Layout,
    placements: Sequence[RankPlacement],
    *,
    command: Sequence[str],
    nodes: int | None = None,
    hosts: Sequence[str] | None = None,
    master_port: int = DEFAULT_MASTER_PORT,
    facts: CpuFacts | None = None,
    device: str = "gpu",
    mem_policy: str = DEFAULT_MEM_POLICY,
    launcher: LauncherOptions | None = None,
) -> LaunchSpec:
    """The launch spec for these placements on `nodes` identical machines described by `topology`.

    `facts` are the live machine's CPU facts (SMT siblings, NUMA nodes); without them the CPU lists of the
    topology are read under topoplan.cpuset's numbering assumption. `hosts` (one per node) give the rendezvous
    address; for a single node without hosts, 127.0.0.1 is used. `device="cpu"`: the topology's devices are CPU
    slots (topoplan.launch.cpu_slots) and no CUDA or NCCL variable is set. `mem_policy` is a key of
    topoplan.launch.binding.MEM_POLICIES; `launcher` holds the launchers' own options (Slurm, Open MPI).
    """
    check_device(device)
    check_mem_policy(mem_policy)
    on_gpu = device == "gpu"
    nodes = nodes if nodes is not None else 1 + max((p.node for p in placements), default=0)
    check_nodes(nodes)
    if not 1 <= master_port <= 65535:
        raise TopoplanError(f"port {master_port} is not a TCP port (1..65535)")
    if not command:
        raise TopoplanError("no command to launch")
    by_rank = _check_placements(topology, layout, placements, nodes)
    host_names, master_addr = _resolve_hosts(hosts, nodes, by_rank[0].node)
    source = topology.source or None
    memory_only = {g.gpu_numa_id for g in topology.gpus if g.gpu_numa_id is not None}
    notes: list[str] = []
    if facts is None:
        notes.append("SMT siblings assumed from Linux numbering (two equal CPU runs = cores, then their "
                     "siblings); on the machine itself, pass --this-machine to read /sys instead")

    node_specs: list[NodeSpec] = []
    ranks: dict[int, RankSpec] = {}
    hca = ib_hca(topology)  # the same node-wide list for every rank
    gid = None
    if hca is not None and nodes > 1:  # RoCE's routable GID, read where launch runs on the machine itself
        if facts is not None:
            gid = roce_gid_index(hca.value.lstrip("=").split(","))
        else:
            notes.append("several nodes: if the NICs run RoCE (not InfiniBand), NCCL_IB_GID_INDEX must name their "
                         "RoCE v2 GID (usually 3; `show_gids`); launch with --this-machine to read it from sysfs")
    for node in range(nodes):
        mine = [p for p in by_rank if p.node == node]
        if not mine:
            raise TopoplanError(f"node {node} runs no rank of {layout}: use --nodes {nodes - 1} or a bigger layout")
        gpus = [topology.gpu(p.gpu) for p in mine]
        cvd = ",".join(str(g.index) for g in gpus) if on_gpu else ""
        node_specs.append(NodeSpec(node, host_names[node], tuple(p.rank for p in mine), cvd))
        sources = {p.rank: cpu_source(g, topology, facts) for p, g in zip(mine, gpus)}
        bindable = {rank: src.cpus for rank, src in sources.items() if src.cpus}
        shares = split_cpus(bindable, facts, where=f"node {node}", source=source)
        p2p, p2p_notes = p2p_level(topology, [g.id for g in gpus])
        notes += [f"node {node}: {note}" for note in p2p_notes]
        fabric = mnnvl(topology, nodes)
        for local_rank, (p, gpu) in enumerate(zip(mine, gpus)):
            share = shares.get(p.rank)
            mem_node, mem_reason = memory_node(share.cpus if share else None, gpu.numa_node, memory_only, facts)
            if MEM_POLICIES[mem_policy][0] is None:
                mem_node, mem_reason = None, "--mem-policy none"
            env = [
                EnvVar("RANK", str(p.rank), f"global rank: tp={p.tp_rank}, pp={p.pp_rank}, dp={p.dp_rank} "
                       "in TP-fastest order"),
                EnvVar("LOCAL_RANK", str(local_rank), f"position among the {len(mine)} ranks on node {node}"),
                EnvVar("WORLD_SIZE", str(layout.world), f"tp*pp*dp of {layout}"),
                EnvVar("LOCAL_WORLD_SIZE", str(len(mine)), f"ranks on node {node}"),
            ]
            if master_addr is not None:
                env.append(EnvVar("MASTER_ADDR", master_addr, f"rendezvous host: node {by_rank[0].node}, which runs "
                                  "rank 0 "
                                  "and serves the store"))
            env.append(EnvVar("MASTER_PORT", str(master_port), "rendezvous TCP port on MASTER_ADDR"))
            if on_gpu:
                env += device_env(topology.vendor, cvd, f"node {node}'s planned GPUs in local-rank order: local rank "
                                  f"{local_rank} uses cuda:{local_rank} = {gpu.id}")
            if share:
                env.append(EnvVar("OMP_NUM_THREADS", str(share.physical_cores),
                                  f"one thread per physical core bound to this rank ({share.physical_cores}); "
                                  "torchrun would otherwise set 1"))
            if share and not on_gpu:
                env.append(EnvVar("GOMP_SPINCOUNT", str(GOMP_SPIN_COUNT),
                                  "a CPU rank's OpenMP threads spin this long at a barrier, not libgomp's 300,000: "
                                  "beside another job the spin holds the core the awaited thread needs (the "
                                  "runner's `small` 3-5x faster so, the same quiet; docs/runner.md)"))
            if hca and on_gpu:
                env.append(hca)
            if gid and on_gpu:
                env.append(gid)
            if p2p and on_gpu:
                env.append(p2p)
            if fabric and on_gpu:
                env.append(fabric)
            src = sources[p.rank]
            ranks[p.rank] = RankSpec(
                p.rank, node, local_rank, p.tp_rank, p.pp_rank, p.dp_rank, gpu.id, gpu.index, gpu.pci_bus_id,
                gpu.uuid, local_rank, share.cpus if share else None, share.physical_cores if share else None,
                mem_node, f"{MEM_POLICIES[mem_policy][1]}; node: {mem_reason}", tuple(env), src.node,
                src.reason + (", split between the ranks sharing it, whole physical cores first" if share else ""),
                mem_policy)
        notes += [f"node {node}: {sources[p.rank].reason}" for p, g in zip(mine, gpus) if not g.cpus]
    if on_gpu and hca is None:
        notes.append("NCCL_IB_HCA not set: the topology names no NICs near the GPUs")
    if nodes > 1 and mnnvl(topology, nodes):
        notes.append(f"the {nodes} nodes are taken to be trays of one NVLink domain (the same rack and NVLink "
                     "partition as this topology's GPUs): TP/EP groups spanning them run over NVLink")
    if on_gpu and topology.vendor == "amd":
        notes.append("AMD GPUs: HIP_VISIBLE_DEVICES selects them (ROCR_VISIBLE_DEVICES must be unset or list every "
                     "GPU); RCCL reads the NCCL_* variables")
    if on_gpu:
        notes += vendor_of(topology.vendor).host_notes
    return LaunchSpec(layout, tuple(ranks[r] for r in range(layout.world)), tuple(node_specs), tuple(command),
                      master_addr, master_port, len(topology.gpus) if on_gpu else 0, tuple(notes), device,
                      launcher or LauncherOptions(), topology.vendor if on_gpu else None)


def require_node_blocks(spec: LaunchSpec, launcher: str) -> int:
    """Ranks per node, for launchers that number ranks node by node with the same count on every node.

    torchrun and srun give node n the ranks n*k .. n*k+k-1; a placement that does not is refused rather
    than started with the wrong ranks on the wrong GPUs.
    """
    per_node = len(spec.nodes[0].ranks)
    for node in spec.nodes:
        if node.ranks != tuple(range(node.index * per_node, (node.index + 1) * per_node)):
            raise TopoplanError(
                f"{launcher} numbers ranks node by node ({per_node} per node), but the placement puts ranks "
                f"{list(node.ranks)} on node {node.index}; use --format mpirun or shell for this placement")
    return per_node


def require_master_addr(spec: LaunchSpec, launcher: str) -> str:
    if spec.master_addr is None:
        raise TopoplanError(f"{launcher} over {len(spec.nodes)} nodes needs their host names: give --hosts "
                            "(one per node, node 0 first)")
    return spec.master_addr
