"""`--format lws`: a serving engine's launch as a Kubernetes LeaderWorkerSet (kubernetes-sigs/lws, API
leaderworkerset.x-k8s.io/v1), the way vLLM, SGLang and llm-d run one replica over several machines.

One LWS group is one copy of the launch: the leader pod runs node 0's command and serves HTTP, worker pods 1..N-1
run the other nodes'. LWS sets LWS_LEADER_ADDRESS (the leader pod's DNS name) and LWS_WORKER_INDEX (0 for the
leader) in every container, so the rendezvous address is written `$(LWS_LEADER_ADDRESS)` (Kubernetes expands it in
command and env; every other `$` is doubled to stay literal, topoplan.launch.runtime_addr.kube_word), and with
several workers one command picks its node's line by LWS_WORKER_INDEX (the per-node wrapper Slurm uses too).

Every pod:
- asks for every GPU of its machine (nvidia.com/gpu, amd.com/gpu by vendor): the device plugin then gives it all
  of them, which CUDA with CUDA_DEVICE_ORDER=PCI_BUS_ID (and HIP) number as the host does, so the plan's visible
  devices still name the planned GPUs; a pod given fewer GPUs would see its own renumbered from 0;
- asks for an RDMA device when the plan routes NCCL over NICs (NCCL_IB_HCA), and adds IPC_LOCK, which NCCL needs
  to pin (register) memory for RDMA;
- mounts a memory-backed emptyDir on /dev/shm: a container's default 64 MiB is too small for NCCL's shared-memory
  transport and the engines' worker queues;
- the leader is ready when GET /health answers (readiness probe), which all three engines serve.

CPU and NUMA: inside a pod the kubelet, not topoplan, picks the CPUs, and the host CPU numbers of topoplan's
numactl would name CPUs the container may not have; so numactl is left out. With --pod-memory the pod is
Guaranteed (integer CPUs = the node's planned CPU count, requests = limits), and a kubelet running the static CPU
manager gives it exclusive CPUs that its topology manager aligns with the GPUs' NUMA node(s): the YAML's comment
names the policy the plan needs. Without --pod-memory the pod asks for no CPU or memory and is not pinned.
"""

from __future__ import annotations

import re

from topoplan.errors import TopoplanError
from topoplan.launch.dispatch import dispatch_argv, env_words
from topoplan.launch.engines.common import EngineLaunch, NodeCommand
from topoplan.launch.engines.health import HEALTH_PATH
from topoplan.launch.nccl_env import EnvVar
from topoplan.launch.runtime_addr import HOST_IP, IFNAME, LWS_LEADER_VAR, kube_word, shell_join
from topoplan.launch.yaml_text import Commented, dump
from topoplan.vendors import vendor_of

API_VERSION = "leaderworkerset.x-k8s.io/v1"  # LWS v0.10.0 (tests/data/lws)
WORKER_INDEX_VAR = "LWS_WORKER_INDEX"
# The NVIDIA Network Operator's shared RDMA device plugin (its default resource name): one device gives the pod
# every HCA of the node. Clusters with SR-IOV or another plugin name theirs instead.
RDMA_RESOURCE = "rdma/rdma_shared_device_a"
SHM_VOLUME = "dshm"
MODEL_VOLUME = "model"
NUMA_BINDERS = ("--numa-bind", "--numa-node")  # engine options that make the engine bind memory itself
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
PROBE_PERIOD_S = 10
PROBE_TIMEOUT_S = 5  # a busy server answers /health late; the default 1 s would flap readiness under load


HOST_CPU_OPTIONS = ("--numa-bind-cpus",)  # engine options naming host CPU numbers (vLLM's per-worker CPU lists)


def job_name(given: str | None, default: str) -> str:
    """--job-name, else `default`: the LeaderWorkerSet's name, which Kubernetes takes only as a DNS label."""
    name = given or default
    if not _DNS_LABEL.fullmatch(name):
        raise TopoplanError(f"--job-name {name!r}: a LeaderWorkerSet's name is a DNS label: lowercase letters, digits "
                            "and '-', starting and ending with a letter or digit, at most 63 characters")
    return name


def readiness_probe(port: int, why: str) -> Commented:
    """The leader container's readiness: GET /health on the served port."""
    return Commented({"httpGet": {"path": HEALTH_PATH, "port": port}, "periodSeconds": PROBE_PERIOD_S,
                      "timeoutSeconds": PROBE_TIMEOUT_S}, why)


def storage(checkpoint: str, shm_users: str) -> tuple[list[dict], list[Commented]]:
    """(volumeMounts, volumes) of a serving container: /dev/shm in memory (`shm_users`: what needs more than the
    64 MiB default) and, for a checkpoint given as a path, that host folder read-only at the same path."""
    mounts: list[dict] = [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}]
    volumes = [Commented({"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}},
                         f"/dev/shm in memory: the 64 MiB default is too small for {shm_users}")]
    if checkpoint.startswith("/"):
        mounts.append({"name": MODEL_VOLUME, "mountPath": checkpoint, "readOnly": True})
        volumes.append(Commented({"name": MODEL_VOLUME, "hostPath": {"path": checkpoint, "type": "Directory"}},
                                 "the checkpoint, at the same path on every GPU node (replace with your "
                                 "PersistentVolumeClaim where the weights live on shared storage)"))
    return mounts, volumes


def _unbound(argv: tuple[str, ...]) -> list[str]:
    """The argv without host CPU numbers, which mean nothing in a container's cpuset: no leading `numactl ... --`,
    no engine option listing CPUs (the NUMA node options stay: the kubelet's topology manager keeps a pod's CPUs
    on the GPUs' nodes)."""
    if argv and argv[0] == "numactl" and "--" in argv:
        argv = argv[argv.index("--") + 1:]
    out, skipping = [], False
    for word in argv:
        if word in HOST_CPU_OPTIONS:
            skipping = True
        elif skipping and not word.startswith("--"):
            continue
        else:
            skipping = False
            out.append(word)
    return out


POD_IFNAME = "eth0"  # the pod network's interface in every container (its address is the pod IP)


def _env_entry(v: EnvVar) -> Commented:
    """One container variable. The multi-node network placeholders become the pod's own: its interface and, for
    the address it announces, the pod IP from the downward API (a pod cannot run the scripts' `ip` lookup)."""
    if HOST_IP in v.value:
        return Commented({"name": v.name, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                         "this pod's IP, which the engine announces to the other pods")
    if IFNAME in v.value:
        return Commented({"name": v.name, "value": v.value.replace(IFNAME, POD_IFNAME)},
                         f"the pod network's interface ({POD_IFNAME}), which reaches the other pods of the group")
    return Commented({"name": v.name, "value": kube_word(v.value)}, v.reason)


def _env(env: tuple[EnvVar, ...] | list[EnvVar]) -> list[Commented]:
    return [_env_entry(v) for v in env]


def _worker_command(workers: list[NodeCommand]) -> tuple[list[str], list[EnvVar]]:
    """Command and shared env of the worker template: one worker runs its own line; several pick theirs by
    LWS_WORKER_INDEX, each with the variables in which they differ."""
    if len(workers) == 1:
        return [kube_word(w) for w in _unbound(workers[0].argv)], list(workers[0].env)
    shared = [v for v in workers[0].env if all(w.env_dict().get(v.name) == v.value for w in workers[1:])]
    names = {v.name for v in shared}
    cases = {w.node: [*env_words({k: v for k, v in w.env_dict().items() if k not in names}), *_unbound(w.argv)]
             for w in workers}
    wrapper = dispatch_argv(WORKER_INDEX_VAR, cases, join=lambda words: shell_join(words, LWS_LEADER_VAR))
    return [kube_word(w) for w in wrapper], shared


def _resources(launch: EngineLaunch, node: int) -> tuple[dict, list[str]]:
    """The container's resources (requests = limits) and the comment lines saying what they give."""
    spec = launch.spec
    ranks = spec.node_ranks(node)
    names = {v.name for r in ranks for v in r.env}
    limits: dict[str, object] = {}
    notes = []
    gpu = vendor_of(spec.vendor).k8s_gpu_resource if spec.device == "gpu" else None  # topoplan.vendors
    if gpu is not None and spec.gpus_per_node:
        limits[gpu] = spec.gpus_per_node
        notes.append(f"{gpu}: all {spec.gpus_per_node} GPUs of the machine, so the planned GPUs keep their host "
                     "numbers (PCI bus order) inside the pod")
    if "NCCL_IB_HCA" in names:
        limits[RDMA_RESOURCE] = 1
        notes.append(f"{RDMA_RESOURCE}: the plan sends NCCL over the NICs of NCCL_IB_HCA (NVIDIA Network "
                     "Operator's shared RDMA device; use your cluster's RDMA resource name)")
    cpus = sorted({c for r in ranks for c in r.cpus or ()}) if all(r.cpus for r in ranks) else []
    memory = spec.launcher.pod_memory
    if memory is not None and cpus:
        numa = sorted({r.mem_node for r in ranks if r.mem_node is not None})
        policy = "single-numa-node" if len(numa) == 1 else "restricted"
        limits.update({"cpu": len(cpus), "memory": memory})
        notes.append(f"Guaranteed QoS, {len(cpus)} whole CPUs (the CPUs topoplan planned for node {node}'s ranks) "
                     f"on NUMA node(s) {','.join(map(str, numa)) or '?'}: pinned only by a kubelet with "
                     f"--cpu-manager-policy=static and --topology-manager-policy={policy} (and "
                     "--topology-manager-scope=pod), which align them with the GPUs")
    else:
        notes.append("no CPU or memory request: the pod is not Guaranteed, so the kubelet pins no CPUs"
                     + (" (give --pod-memory to pin them)" if cpus else " (the topology gives no CPU affinity)"))
    return {"limits": limits, "requests": dict(limits)}, notes


def _pod(launch: EngineLaunch, node: int, command: list[str], env: list[EnvVar], serves: bool) -> dict:
    options, image = launch.options, launch.spec.launcher.image
    resources, notes = _resources(launch, node)
    container: dict[str, object] = {"name": launch.engine.name, "image": image, "command": command, "env": _env(env)}
    if serves:
        container["ports"] = [{"name": "http", "containerPort": options.port}]
        container["readinessProbe"] = readiness_probe(
            options.port, f"ready once {launch.engine.name} answers GET {HEALTH_PATH} (its workers are up)")
    container["resources"] = Commented(resources, "\n".join(notes))
    numa = any(word in NUMA_BINDERS for word in command)
    capabilities, why = ["IPC_LOCK"], "IPC_LOCK: NCCL pins (registers) memory for RDMA and CUDA IPC"
    if numa:  # the runtime's default seccomp profile allows mbind/set_mempolicy only with CAP_SYS_NICE
        capabilities.append("SYS_NICE")
        why += ("; SYS_NICE: the engine binds each worker's memory to its NUMA node (mbind, set_mempolicy), which "
                "the default seccomp profile allows only with it (the image needs numactl for vLLM's --numa-bind)")
    container["securityContext"] = Commented({"capabilities": {"add": capabilities}}, why)
    container["volumeMounts"], volumes = storage(options.checkpoint, "NCCL's shared-memory transport and the "
                                                 "engine's worker queues")
    return {"containers": [container], "volumes": volumes}


def lws_manifest(launch: EngineLaunch) -> tuple[dict, list[str]]:
    """The LeaderWorkerSet as data, and the header comment lines."""
    spec = launch.spec
    if not launch.nodes:
        raise TopoplanError("--format lws with TensorRT-LLM over several nodes: its ranks are MPI processes started "
                            "by mpirun or srun, which a LeaderWorkerSet does not run; use --format mpirun, srun or "
                            "sbatch")
    if launch.options.device == "cpu":
        raise TopoplanError("--format lws with --device cpu: the CPU launch binds vLLM's threads to this machine's CPU "
                            "numbers, while a pod's CPUs are the kubelet's choice; launch on GPUs, or use --format "
                            "shell on the machine itself")
    if spec.launcher.image is None:
        raise TopoplanError(f"--format lws needs --image: the container image with {launch.engine.name} installed "
                            "(e.g. vllm/vllm-openai:v0.32.0, lmsysorg/sglang:v0.5.3)")
    name = job_name(spec.launcher.job_name, f"topoplan-{launch.engine.name}")
    leader, workers = launch.nodes[0], list(launch.nodes[1:])
    template: dict[str, object] = {"size": len(launch.nodes),
                                   "restartPolicy": Commented("RecreateGroupOnPodRestart", "a pod that restarts "
                                                              "leaves the others' NCCL communicators broken: restart "
                                                              "the whole group")}
    leader_pod = _pod(launch, 0, [kube_word(w) for w in _unbound(leader.argv)], list(leader.env), serves=True)
    if workers:
        command, env = _worker_command(workers)
        template["leaderTemplate"] = {"metadata": {"labels": {"role": "leader"}}, "spec": leader_pod}
        template["workerTemplate"] = {"metadata": {"labels": {"role": "worker"}},
                                      "spec": _pod(launch, workers[0].node, command, env, serves=False)}
    else:  # a group of one: the worker template is the leader's
        template["workerTemplate"] = {"spec": leader_pod}
    document = {"apiVersion": API_VERSION, "kind": "LeaderWorkerSet", "metadata": {"name": name},
                "spec": {"replicas": Commented(1, "one serving copy of this layout; each replica is a group of "
                                               f"{len(launch.nodes)} pod(s)"),
                         "leaderWorkerTemplate": template}}
    header = [f"topoplan launch: {launch.engine.name} serving {launch.options.checkpoint} with {spec.layout}, "
              f"{spec.world} rank(s) on {len(launch.nodes)} pod(s) of one machine each; HTTP on port "
              f"{launch.options.port} of the leader pod",
              launch.device_mapping,
              "CPU/NUMA: numactl's host CPU numbers are left out (the kubelet picks a pod's CPUs); see each pod's "
              "resources for the kubelet policy that pins them",
              *(f"note: {note}" for note in (*launch.notes, *spec.notes))]
    return document, header


def render_lws(launch: EngineLaunch) -> str:
    document, header = lws_manifest(launch)
    return dump(document, header)
