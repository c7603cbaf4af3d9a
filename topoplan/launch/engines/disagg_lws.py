"""`launch --disagg --format lws`: a disaggregated deployment as one Kubernetes LeaderWorkerSet (kubernetes-sigs/lws).

One pod per node of the plan, in one group: the leader pod is node 0 (its workers and the router, which the
readiness probe checks), worker pod n is node n. Every pod runs the shell format's script for its own node
(topoplan.launch.engines.disagg_scripts), picking it by LWS_WORKER_INDEX, which LWS sets in every container. Each pod
asks for every GPU of its machine, as topoplan.launch.engines.render_lws does and for the same reason: the device
plugin then gives all of them, numbered as on the host, so each worker's CUDA_VISIBLE_DEVICES still names its
planned GPUs; prefill and decode workers that share a machine share its pod, since two pods asking for a whole
machine cannot land on one. Node n's address is its pod's DNS name in the group's headless service (the leader's:
LWS_LEADER_ADDRESS). Host CPU numbers are left out of the engine options (the kubelet picks a pod's CPUs); the
NUMA node options stay.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from topoplan.errors import TopoplanError
from topoplan.launch.engines.disagg import NODE_ADDR_VAR, NODE_VAR, DisaggLaunch
from topoplan.launch.engines.render_lws import (
    API_VERSION,
    NUMA_BINDERS,
    POD_IFNAME,
    RDMA_RESOURCE,
    WORKER_INDEX_VAR,
    _unbound,
    job_name,
    readiness_probe,
    storage,
)
from topoplan.launch.runtime_addr import IFNAME_VAR, LWS_LEADER_VAR, kube_word
from topoplan.launch.yaml_text import Commented, dump
from topoplan.vendors import vendor_of


def _pod(launch: DisaggLaunch, script: str, leader: bool) -> dict:
    options = launch.options
    gpu = vendor_of(launch.vendor).k8s_gpu_resource
    limits: dict[str, object] = {gpu: launch.gpus_per_node}
    notes = [f"{gpu}: all {launch.gpus_per_node} GPUs of the machine, so each worker's planned GPUs keep their host "
             "numbers (PCI bus order) inside the pod"]
    if any(nic for p in launch.workers for nic in p.nics):
        limits[RDMA_RESOURCE] = 1
        notes.append(f"{RDMA_RESOURCE}: the KV cache leaves each GPU by its planned NIC (NVIDIA Network Operator's "
                     "shared RDMA device; use your cluster's RDMA resource name)")
    container: dict[str, object] = {
        "name": launch.engine.name, "image": launch.launcher.image,
        "command": ["bash", "-c", kube_word(script), "topoplan-disagg"],
        "env": [Commented({"name": IFNAME_VAR, "value": POD_IFNAME}, "the pod network's interface: the address each "
                          "engine announces for the KV handshake is read from it (the image needs iproute2)")]}
    if leader:
        container["ports"] = [{"name": "http", "containerPort": options.port}]
        container["readinessProbe"] = readiness_probe(options.port, "ready once the router answers (after every "
                                                      "worker did)")
    container["resources"] = Commented({"limits": limits, "requests": dict(limits)}, "\n".join(notes))
    capabilities, why = ["IPC_LOCK"], "IPC_LOCK: the KV transfer engines pin (register) GPU memory for RDMA"
    if any(w in NUMA_BINDERS for w in script.split()):
        capabilities.append("SYS_NICE")
        why += "; SYS_NICE: the engines bind each worker's memory to its NUMA node"
    container["securityContext"] = Commented({"capabilities": {"add": capabilities}}, why)
    container["volumeMounts"], volumes = storage(options.checkpoint, "NCCL and the engines' worker queues")
    return {"containers": [container], "volumes": volumes}


def render_disagg_lws(launch: DisaggLaunch, body_lines: Callable[[DisaggLaunch], list[str]]) -> str:
    """The LeaderWorkerSet; `body_lines` writes the shell format's script for a launch (topoplan.launch.engines.
    disagg_scripts), which every pod runs."""
    if launch.launcher.image is None:
        raise TopoplanError(f"--format lws needs --image: the container image with {launch.engine.name} installed")
    name = job_name(launch.launcher.job_name, f"topoplan-{launch.engine.name}-disagg")
    unbound = tuple(replace(p, argv=tuple(_unbound(p.argv))) for p in launch.processes)
    # node 0 is the leader pod; node n the group's worker pod n, <name>-0-<n> in the headless service <name>
    addresses = [f'export {NODE_ADDR_VAR.format(node=0)}="${{{LWS_LEADER_VAR}}}"',
                 *(f"export {NODE_ADDR_VAR.format(node=n)}={name}-0-{n}.{name}" for n in range(1, launch.nodes))]
    script = "\n".join([f'{NODE_VAR}="${{{WORKER_INDEX_VAR}:-0}}"', *(addresses if launch.nodes > 1 else []),
                        *body_lines(replace(launch, processes=unbound))])
    template: dict[str, object] = {"size": launch.nodes,
                                   "restartPolicy": Commented("RecreateGroupOnPodRestart", "a worker that restarts "
                                                              "loses the router's and its peers' KV sessions: "
                                                              "restart the whole group")}
    leader = _pod(launch, script, leader=True)
    if launch.nodes > 1:
        template["leaderTemplate"] = {"metadata": {"labels": {"role": "leader"}}, "spec": leader}
        template["workerTemplate"] = {"metadata": {"labels": {"role": "worker"}},
                                      "spec": _pod(launch, script, leader=False)}
    else:
        template["workerTemplate"] = {"spec": leader}
    document = {"apiVersion": API_VERSION, "kind": "LeaderWorkerSet", "metadata": {"name": name},
                "spec": {"replicas": Commented(1, "one deployment: its group is one pod per node of the plan"),
                         "leaderWorkerTemplate": template}}
    prefill, decode = launch.plan.ratio
    header = [f"topoplan launch --disagg: {launch.engine.name} serving {launch.options.checkpoint}: {prefill} prefill "
              f"and {decode} decode worker(s) on {launch.nodes} pod(s) of one machine each; the router on port "
              f"{launch.options.port} of the leader pod", f"router: {launch.router_label}",
              "CPU/NUMA: host CPU numbers are left out (the kubelet picks a pod's CPUs); the NUMA node options stay",
              *(f"note: {note}" for note in launch.notes)]
    return dump(document, header)
