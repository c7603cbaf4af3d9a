"""`launch --engine sglang|vllm --disagg`: a disaggregated plan (topoplan.plan.disagg_types.DisaggPlan) as engine
processes: every prefill and every decode worker its own engine server, and the router in front of them.

What is shared by both engines lives here: where each worker runs and is reached (its node, HTTP port, visible
GPUs, CPU/NUMA binding), and the ports and addresses that tie the workers to the router. What each engine takes
(its prefill/decode options, the NIC of each GPU's KV transfer, its router command) is written by the engine's own
module (topoplan.launch.engines.sglang / .vllm: `disagg_worker`, `disagg_router`), named by Engine.launcher.
topoplan.launch.engines.disagg_scripts writes the processes as a shell script, a Slurm batch script, a
LeaderWorkerSet or JSON.

Ports: the router answers on --port (default 8000), worker k of the plan (prefill workers first) on --port + 1 + k.
Addresses: on one node every worker serves on loopback and the router reaches it there; a plan over several nodes
has each worker serve on every interface and the router reach node n at a placeholder word (NODE_ADDR) that each
format fills: the shell script from --hosts or TOPOPLAN_NODE<n>_ADDR, the batch script from the allocation, the
LeaderWorkerSet from its pods' DNS names.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from importlib import import_module
from typing import TYPE_CHECKING, Any

from topoplan.cpuset import format_cpu_list, split_cpus
from topoplan.engines.engine import Engine
from topoplan.errors import TopoplanError
from topoplan.launch.device_env import device_env
from topoplan.launch.engines import check_release
from topoplan.launch.engines.common import (
    DEFAULT_HOST,
    EngineSettings,
    Option,
    ServeOptions,
    SettingsFlags,
    WorkerBinding,
    settings_options,
)
from topoplan.launch.launcher_options import LauncherOptions
from topoplan.launch.nccl_env import EnvVar
from topoplan.launch.runtime_addr import ALL_INTERFACES, HOST_IP
from topoplan.launch.spec import check_hosts
from topoplan.plan.disagg_types import DisaggPlan, Worker
from topoplan.topology.model import Topology

if TYPE_CHECKING:  # the planner loads only when a plan is made (start-up time)
    from topoplan.plan.frontend import PlanRequest
    from topoplan.plan.rank import Plan

NODE_ADDR = "@TOPOPLAN_NODE{node}_ADDR@"  # node n's address, filled per format (see the module docstring)
NODE_ADDR_RE = re.compile(r"@TOPOPLAN_NODE(\d+)_ADDR@")
NODE_ADDR_VAR = "TOPOPLAN_NODE{node}_ADDR"  # the scripts' variable holding node n's address
NODE_VAR = "TOPOPLAN_NODE"  # the scripts' variable naming the node they run on


def node_address(node: int) -> str:
    return NODE_ADDR.format(node=node)


@dataclass(frozen=True)
class WorkerSlot:
    """Where one worker of the plan runs and how the others reach it: what an engine module needs to write its
    line. `k` is its position in the plan (prefill workers first), which numbers its ports."""

    worker: Worker
    k: int
    port: int  # its HTTP port
    listen: str  # its --host
    address: str  # where the router (and, for the KV handshake, the other role's workers) reach its node
    env: tuple[EnvVar, ...]  # visible GPUs, and the node address the engine announces (several nodes)
    binding: WorkerBinding | None
    multi_node: bool  # the plan spans nodes: the engine must announce a routable address, not loopback

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"

    @property
    def nic_names(self) -> tuple[str | None, ...]:
        """Each GPU's KV NIC, in the worker's GPU (= local CUDA index) order."""
        return tuple(route.nic_name for route in self.worker.routes)

    def server_options(self, engine: Engine, options: ServeOptions, flags: SettingsFlags,
                       parallel: list[Option], binding: Callable[[WorkerBinding], list[Option]]) -> list[Option]:
        """What every engine's worker server takes alike: its layout (`parallel`, in the engine's words), its
        binding, what the plan priced (in the engine's `flags`), and where it listens."""
        w = self.worker
        chosen = parallel + (binding(self.binding) if self.binding is not None else [])
        if options.settings is not None:
            chosen += settings_options(options.settings, engine.memory.option, flags)
        listen = ("every interface: the router and the other node's workers reach it" if self.multi_node
                  else "loopback: the router on this node reaches it there")
        return chosen + [Option(("--host", self.listen), listen),
                         Option(("--port", str(self.port)), f"{w.name}'s own HTTP port (the router's + 1 + {self.k})")]


@dataclass(frozen=True)
class Process:
    """One process of the deployment: a worker's engine server, or the router. `argv` words may hold NODE_ADDR
    and topoplan.launch.runtime_addr placeholders; the formats fill them."""

    name: str  # "prefill0", "decode1", "router"
    role: str  # "prefill", "decode" or "router"
    index: int  # within its role
    node: int
    argv: tuple[str, ...]
    env: tuple[EnvVar, ...]
    options: tuple[Option, ...]  # the options topoplan chose, with reasons (in argv already)
    port: int
    address: str  # where the router reaches it (the router: where it is reached itself)
    gpus: tuple[str, ...] = ()
    nics: tuple[str | None, ...] = ()

    def env_dict(self) -> dict[str, str]:
        return {v.name: v.value for v in self.env}


@dataclass(frozen=True)
class DisaggLaunch:
    """A disaggregated deployment's processes: the workers (prefill first) and, last, the router on node 0."""

    engine: Engine
    plan: DisaggPlan
    options: ServeOptions
    processes: tuple[Process, ...]
    nodes: int
    hosts: tuple[str | None, ...]  # --hosts, one per node (None: unknown until the job runs)
    router_label: str  # what the router is, in words ("SGLang's router (sglang_router) in PD mode")
    gpus_per_node: int  # GPUs of the machine (a Slurm job or a pod asks for all of them)
    vendor: str | None  # the GPUs' vendor (topoplan.vendors)
    launcher: LauncherOptions = LauncherOptions()  # Slurm and LWS options
    notes: tuple[str, ...] = ()

    @property
    def workers(self) -> tuple[Process, ...]:
        return self.processes[:-1]

    @property
    def router(self) -> Process:
        return self.processes[-1]

    @property
    def url(self) -> str:
        return f"http://{self.options.host}:{self.options.port}"


def _cpu_shares(plan: DisaggPlan, topology: Topology) -> dict[tuple[int, int], str]:
    """Every worker GPU's CPUs, (worker k, local GPU i) -> a CPU list: each worker's CPUs (the plan's worker.cpus)
    split over its GPUs, each GPU from the CPUs near it, without overlap between the workers of one node
    (topoplan.cpuset.split_cpus over all of a node's worker GPUs at once: workers of one socket share its cores).
    A worker with a GPU the topology lists no CPUs for gets none: another socket's CPUs are no binding for it."""
    out: dict[tuple[int, int], str] = {}
    for node in sorted({w.node for w in plan.workers}):
        keys, requests = [], {}
        for k, w in enumerate(plan.workers):
            if w.node != node or not w.cpus or not all(topology.gpu(g).cpus for g in w.gpus):
                continue
            for i, gpu in enumerate(w.gpus):
                near = set(topology.gpu(gpu).cpus or ())
                requests[len(keys)] = [c for c in w.cpus if c in near]
                keys.append((k, i))
        shares = split_cpus(requests, None, where=f"node {node}'s workers")
        out.update((key, format_cpu_list(shares[n].cpus)) for n, key in enumerate(keys))
    return out


def _binding(worker: Worker, k: int, topology: Topology, shares: Mapping[tuple[int, int], str],
             ) -> tuple[WorkerBinding | None, str | None]:
    """The worker's per-GPU binding in its local order: each GPU's NUMA node and its CPU share (None: the plan
    gives the worker no CPUs, as where the source lists no affinity, or lists none for one of its GPUs)."""
    gpus = [topology.gpu(g) for g in worker.gpus]
    if any(g.numa_node is None for g in gpus):
        return None, (f"{worker.name}: the topology names no NUMA node for "
                      f"{', '.join(g.id for g in gpus if g.numa_node is None)}, so the worker is not bound")
    bare = [g.id for g in gpus if not g.cpus]
    cpus = tuple(shares[(k, i)] for i in range(len(gpus))) if worker.cpus and not bare else None
    why_not = (f"{worker.name}: the topology lists no CPU affinity for {', '.join(bare)}, so the worker binds its "
               "GPUs' NUMA nodes only" if worker.cpus and bare else None)
    return WorkerBinding(cpus, tuple(g.numa_node for g in gpus)), why_not  # type: ignore[misc]


def _slot(worker: Worker, k: int, topology: Topology, options: ServeOptions, multi_node: bool,
          address: str, announce_var: str, shares: Mapping[tuple[int, int], str]) -> tuple[WorkerSlot, list[str]]:
    visible = ",".join(str(topology.gpu(g).index) for g in worker.gpus)
    routes = ", ".join(f"{r.gpu} -> {r.nic_name or r.nic or 'no NIC'}" for r in worker.routes)
    env = device_env(topology.vendor, visible, f"{worker.name}'s GPUs in its rank order ({', '.join(worker.gpus)}): "
                     f"the plan's {worker.role} GPUs, disjoint from the other workers'; KV NICs {routes}")
    if multi_node:
        env.append(EnvVar(announce_var, HOST_IP, f"node {worker.node}'s IPv4 address on TOPOPLAN_IFNAME, read when "
                          "the line runs: the address the engine announces for the KV transfer handshake (left to "
                          "itself it may pick loopback or a container bridge)"))
    binding, why_not = _binding(worker, k, topology, shares)
    port = options.port + 1 + k
    return WorkerSlot(worker, k, port, ALL_INTERFACES if multi_node else DEFAULT_HOST, address, tuple(env),
                      binding, multi_node), [why_not] if why_not else []


def disagg_engines() -> list[str]:
    """The engines whose launch module writes disaggregated workers (a `disagg_worker`), by name."""
    from topoplan.engines import ENGINES

    return sorted({e.name for e in ENGINES if _writes_disagg(e)})


def _launcher(engine: Engine) -> Any:
    return import_module(f"topoplan.launch.engines.{engine.launcher}")


def _writes_disagg(engine: Engine) -> bool:
    return engine.serves and engine.launcher is not None and hasattr(_launcher(engine), "disagg_worker")


def check_disagg_engine(engine: Engine) -> None:
    """An engine whose launch module writes disaggregated workers (SGLang, vLLM), at the release whose options
    (and parser) the lines are written for."""
    if not _writes_disagg(engine):
        raise TopoplanError(f"--disagg with --engine {engine}: launch writes disaggregated prefill/decode "
                            f"workers for {' and '.join(disagg_engines())} only, not yet for {engine}")
    check_release(engine)


def disagg_launch(plan: DisaggPlan, topology: Topology, engine: Engine, options: ServeOptions,
                  hosts: tuple[str, ...] | None = None, launcher: LauncherOptions = LauncherOptions(),
                  settings: Mapping[str, EngineSettings] | None = None) -> DisaggLaunch:
    """The engine's worker servers and router for this plan. `hosts` (one per node the plan uses) fill node
    addresses where known; otherwise they stay NODE_ADDR words for the format to fill. `settings` (by role) are
    what the plan priced for each role's workers (batch, lengths, dtypes), as the engine's options."""
    check_disagg_engine(engine)
    if options.device != "gpu":
        raise TopoplanError("--disagg places prefill and decode workers on GPUs: --device gpu")
    spanning = [w.name for w in plan.workers if w.nodes > 1]
    if spanning:
        raise TopoplanError(f"--disagg: {', '.join(spanning)} span(s) several nodes; launch writes workers of one "
                            "node each (plan with --pd or limits that give smaller workers)")
    if options.port + len(plan.workers) > 65535:
        raise TopoplanError(f"--port {options.port}: the {len(plan.workers)} workers serve on the ports after it, "
                            "past 65535; choose a lower --port")
    nodes = 1 + max(w.node for w in plan.workers)
    shares = _cpu_shares(plan, topology)
    if hosts is not None and len(hosts) != nodes:
        raise TopoplanError(f"--hosts names {len(hosts)} host(s), but the disaggregated plan uses {nodes} node(s)")
    if hosts is not None:
        hosts = check_hosts(hosts, nodes)  # distinct: two nodes on one host would share its GPUs
    known: tuple[str | None, ...] = hosts or (None,) * nodes
    module = _launcher(engine)
    multi_node = nodes > 1

    def address(node: int) -> str:
        if not multi_node:
            return DEFAULT_HOST
        return known[node] or node_address(node)

    processes, notes = [], []
    taken: dict[tuple[int, int], list[str]] = {(0, options.port): ["the router"]}
    for k, worker in enumerate(plan.workers):
        slot, slot_notes = _slot(worker, k, topology, options, multi_node, address(worker.node),
                                 module.DISAGG_HOST_VAR, shares)
        notes += slot_notes
        role_options = replace(options, settings=(settings or {}).get(worker.role))
        argv, env, chosen, extra_ports = module.disagg_worker(engine, slot, role_options)
        for port in (slot.port, *extra_ports):
            taken.setdefault((worker.node, port), []).append(worker.name)
        processes.append(Process(worker.name, worker.role, worker.index, worker.node, tuple(argv), tuple(env),
                                 tuple(chosen), slot.port, slot.address, worker.gpus, slot.nic_names))
        if any(nic is None for nic in slot.nic_names):
            notes.append(f"{worker.name}: the topology names no NIC for "
                         f"{', '.join(r.gpu for r in worker.routes if r.nic_name is None)}; its KV transfer is left "
                         "to the engine's own choice of device")
    clashes = [f"node {node} port {port}: {' and '.join(names)}" for (node, port), names in taken.items()
               if len(names) > 1]
    if clashes:
        raise TopoplanError(f"--port {options.port}: the deployment's ports collide ({'; '.join(clashes)}); choose "
                            "another --port")
    argv, env, chosen, label = module.disagg_router(processes, options)
    router = Process("router", "router", 0, 0, tuple(argv), tuple(env), tuple(chosen), options.port,
                     address(0) if multi_node else options.host)
    return DisaggLaunch(engine, plan, options, (*processes, router), nodes, known, label, len(topology.gpus),
                        topology.vendor, launcher, tuple([*plan.notes, *plan.warnings, *notes]))


def role_settings(plan: Plan, deployment: DisaggPlan) -> dict[str, EngineSettings]:
    """What the disaggregated `deployment` of `plan` priced for each role's workers, as the engine's settings: the
    most requests each worker may hold in flight within the limits (its cap: the steady rate needs fewer, and a
    burst above it finds room), the workload's lengths and dtypes, the engine's memory share at the role's TP
    degree."""
    from topoplan.plan.engine_costs import memory_policy

    served, work = deployment.served, plan.workload
    policy = memory_policy(plan.engine, plan.calibration)
    out = {}
    for role, layout, seqs, steady in (
            ("prefill", deployment.prefill, served.prefill_max_concurrency, served.prefill_concurrency),
            ("decode", deployment.decode, served.decode_max_concurrency, served.decode_concurrency)):
        out[role] = EngineSettings(max_seqs=max(1, seqs), max_model_len=work.prompt_len + work.gen_len,
                                   dtype=plan.device.activation_dtype(work.weights), kv_dtype=work.kv.short,
                                   weights=work.dtype, memory_fraction=round(policy.fraction_for(layout.tp), 4),
                                   why=f"plan --disagg {role} worker {layout}: at most {seqs} in flight within "
                                       f"the limits ({steady} at the deployment's steady rate), prompt "
                                       f"{work.prompt_len} + {work.gen_len} tokens")
    return out


def disagg_launch_for(request: PlanRequest, pd: str | None, options: ServeOptions,
                      hosts: tuple[str, ...] | None = None, launcher: LauncherOptions = LauncherOptions(),
                      rank: int = 1) -> DisaggLaunch:
    """`launch --engine sglang|vllm --disagg [--rank N]`: plan as `plan --disagg` does (topoplan.plan.disagg), then
    write its `rank`-th placed deployment (1: the chosen one; `plan --disagg --json`'s `candidates` order) with
    the settings it priced."""
    from topoplan.plan.disagg import DisaggRequest, disagg_for

    check_disagg_engine(request.engine)
    asked = DisaggRequest.parse(pd)
    result = disagg_for(request, asked.pd, asked.connector)
    deployment = result.deployment(rank)
    return disagg_launch(deployment, result.plan.topology, request.engine, options, hosts, launcher,
                         role_settings(result.plan, deployment))


def saved_disagg_launch(path: str, options: ServeOptions, hosts: tuple[str, ...] | None = None,
                        launcher: LauncherOptions = LauncherOptions(), rank: int = 1) -> DisaggLaunch:
    """`launch --disagg --plan FILE [--rank N]`: the `rank`-th deployment of `plan --disagg -o FILE` (1: the one it
    chose), planned again from the request the file records (every option that priced it: workload, limits,
    engine, topology) and refused when it no longer matches the file (topoplan.plan.saved.load_disagg)."""
    from topoplan.plan.saved import load_disagg

    request, result, deployment = load_disagg(path, rank)
    check_disagg_engine(request.engine)
    return disagg_launch(deployment, result.plan.topology, request.engine, options, hosts, launcher,
                         role_settings(result.plan, deployment))
