"""`--format srun|sbatch`: a Slurm step of whole nodes, bound by local task id with one map for every node.

- GPUs: a step only gets GPUs it asks for, so it asks for every GPU of each node (`--gpus-per-node`, in an
  allocation of whole nodes). It does not use `--gpu-bind=map_gpu`: that leaves each task one visible GPU,
  and NCCL's peer-to-peer path (NVLink, PCIe P2P) between ranks of a node needs every GPU of the node visible
  in each process. Instead the per-rank wrapper sets CUDA_DEVICE_ORDER=PCI_BUS_ID and CUDA_VISIBLE_DEVICES
  (HIP_VISIBLE_DEVICES on AMD, launch/device_env.py) to the node's planned GPUs in local-rank order, so task i
  uses cuda:i. (On AMD nodes Slurm sets ROCR_VISIBLE_DEVICES to the step's GPUs: all of the node's, as asked.)
- Slurm's GPU ids follow gres.conf; with `AutoDetect=nvml` and whole nodes they are the nvidia-smi (PCI bus)
  indices the plan uses. That is the assumption here.
- CPUs and memory: `--cpu-bind=mask_cpu:` and `--mem-bind=[prefer,]map_mem:` bind before the program
  starts, when every task has a CPU list; otherwise (a GPU whose CPU affinity is unknown) Slurm binds
  nothing and the wrapper runs each task's numactl line instead.
- Per-rank variables Slurm cannot map (OMP_NUM_THREADS, CUDA_VISIBLE_DEVICES, NCCL_IB_HCA) are set by a small
  wrapper keyed on SLURM_LOCALID. Slurm sets the rank variables (SLURM_PROCID, ...) that topoplan.rank_env
  reads.
- `--device cpu` asks for no GPU at all, so the lines run on CPU-only clusters.
- The machines are the allocation's: the script reads `scontrol show hostnames "$SLURM_JOB_NODELIST"`, checks
  it has the launch's node count, and takes node 0's address (MASTER_ADDR, an engine's rendezvous and HTTP
  address) from the first host, the node Slurm numbers 0 in a step over the whole allocation. The address is the
  host's NodeAddr, the one Slurm itself reaches it at (the host name when NodeAddr is not set). `--hosts` only
  becomes a `--nodelist`. sbatch asks for whole nodes with all their memory (`--exclusive --mem=0`): the ranks'
  NUMA binding assumes every CPU and the nodes' memory are the job's.
"""

from __future__ import annotations

import shlex

from topoplan.errors import TopoplanError
from topoplan.launch.binding import MEM_POLICIES
from topoplan.launch.dispatch import SHEBANG, dispatch_argv, env_words
from topoplan.launch.launcher_options import DEFAULT_JOB_NAME
from topoplan.launch.runtime_addr import HEAD_VAR, shell_join
from topoplan.launch.spec import LAUNCHER_VARS, RENDEZVOUS_VARS, LaunchSpec, RankSpec, require_node_blocks

_SLURM_SETS = (*LAUNCHER_VARS, *RENDEZVOUS_VARS)
WHOLE_NODES = ("--exclusive", "--mem=0")  # sbatch/salloc: every CPU and all the memory of each node


def salloc_hint(nodes: int) -> str:
    return shlex.join(["salloc", f"--nodes={nodes}", *WHOLE_NODES])


def allocation_lines(nodes: int) -> list[str]:
    """Bash lines that read the allocation: refuse to run outside one or on another node count, and export
    TOPOPLAN_HEAD_ADDR, node 0's address (the NodeAddr of the allocation's first host)."""
    return [
        f': "${{SLURM_JOB_NODELIST:?run inside a Slurm allocation: sbatch, or {salloc_hint(nodes)} bash SCRIPT}}"',
        'mapfile -t topoplan_hosts < <(scontrol show hostnames "$SLURM_JOB_NODELIST")',
        f'if [ "${{#topoplan_hosts[@]}}" -ne {nodes} ]; then',
        f'  echo "topoplan: this launch runs on {nodes} node(s), the allocation ($SLURM_JOB_NODELIST) has '
        '${#topoplan_hosts[@]}" >&2',
        "  exit 2",
        "fi",
        "# node 0 is the allocation's first host (a step over the whole allocation numbers its nodes in this order),",
        "# reached at its NodeAddr, the address Slurm itself uses (its name when NodeAddr is not set)",
        f'{HEAD_VAR}=$(scontrol show node -o "${{topoplan_hosts[0]}}" | '
        "sed -n 's/.*[[:space:]]NodeAddr=\\([^[:space:]]*\\).*/\\1/p')",
        f'export {HEAD_VAR}="${{{HEAD_VAR}:-${{topoplan_hosts[0]}}}}"',
    ]


def _local_binding(r: RankSpec) -> tuple:
    return r.gpu_index, r.cpus, r.cpu_node, r.mem_node, tuple(r.env_dict(_SLURM_SETS).items())


def _check_same_on_every_node(spec: LaunchSpec, per_node: int) -> list[RankSpec]:
    first = spec.node_ranks(0)
    for node in spec.nodes[1:]:
        for a, b in zip(first, spec.node_ranks(node.index)):
            if _local_binding(a) != _local_binding(b):
                raise TopoplanError(
                    f"Slurm applies one binding map to every node, but local rank {a.local_rank} is bound "
                    f"differently on node 0 ({a.gpu}) and node {node.index} ({b.gpu}); use --format mpirun or shell "
                    "for this placement")
    return first


def _mask(cpus: tuple[int, ...]) -> str:
    return hex(sum(1 << c for c in cpus))


def _binding_args(local: list[RankSpec]) -> tuple[list[str], bool]:
    """Slurm's --cpu-bind/--mem-bind, and whether the wrapper must run numactl itself instead."""
    if not all(r.cpus for r in local):
        return ["--cpu-bind=none", "--mem-bind=none"], True
    args = [f"--cpu-bind=mask_cpu:{','.join(_mask(r.cpus) for r in local)}"]  # type: ignore[arg-type]
    policy = local[0].mem_policy
    if MEM_POLICIES[policy][0] is None:
        args.append("--mem-bind=none")
    elif all(r.mem_node is not None for r in local):
        prefer = "prefer," if policy == "preferred" else ""
        args.append(f"--mem-bind={prefer}map_mem:{','.join(str(r.mem_node) for r in local)}")
    else:
        args.append("--mem-bind=local")
    return args, False


def srun_lines(spec: LaunchSpec, cluster_options: bool = True, mpi: str | None = None) -> list[str]:
    """The allocation lines, the MASTER_ADDR/PORT exports and the srun line (last); `cluster_options`: also
    --partition/--account/--time/--job-name when given (an sbatch script puts them in its header instead); `mpi`:
    Slurm's `--mpi` plugin, for programs that are MPI jobs themselves (TensorRT-LLM: pmix)."""
    per_node = require_node_blocks(spec, "srun")
    local = _check_same_on_every_node(spec, per_node)
    args = ["srun", *(spec.launcher.slurm_args() if cluster_options else []), f"--nodes={len(spec.nodes)}",
            f"--ntasks={spec.world}", f"--ntasks-per-node={per_node}"]
    if mpi is not None:
        args.append(f"--mpi={mpi}")
    args += nodelist_args(spec)
    if spec.gpus_per_node:
        args.append(f"--gpus-per-node={spec.gpus_per_node}")
    binding, wrapper_binds = _binding_args(local)
    args += ["--distribution=block", *binding, "--export=ALL"]
    wrapper = dispatch_argv("SLURM_LOCALID", {
        r.local_rank: [*env_words(r.env_dict(_SLURM_SETS)), *(r.binding_argv() if wrapper_binds else [])]
        for r in local})
    return [*allocation_lines(len(spec.nodes)), f'export MASTER_ADDR="${HEAD_VAR}"',
            f"export MASTER_PORT={spec.master_port}", shell_join([*args, *wrapper, *spec.command])]


def render_srun(spec: LaunchSpec, mpi: str | None = None) -> str:
    header = (f"# topoplan launch: {spec.layout}, {spec.world} rank(s) on {len(spec.nodes)} node(s); run inside an "
              f"allocation of whole nodes: {salloc_hint(len(spec.nodes))} bash SCRIPT")
    return "\n".join([SHEBANG, header, "set -euo pipefail", *srun_lines(spec, mpi=mpi)]) + "\n"


def nodelist_args(spec: LaunchSpec) -> list[str]:
    """`--nodelist=a,b` from --hosts, when given (node 0's address is still read from the allocation)."""
    hosts = [n.host for n in spec.nodes]
    return [f"--nodelist={','.join(hosts)}"] if all(hosts) else []  # type: ignore[arg-type]


def sbatch_header(spec: LaunchSpec, tasks_per_node: int, job_name: str = DEFAULT_JOB_NAME) -> list[str]:
    """The `#SBATCH` lines: cluster options, whole nodes with every GPU and all their memory, --hosts."""
    header = [*spec.launcher.slurm_args(job_name=job_name), f"--nodes={len(spec.nodes)}",
              f"--ntasks-per-node={tasks_per_node}"]
    if spec.gpus_per_node:
        header.append(f"--gpus-per-node={spec.gpus_per_node}")
    return [f"#SBATCH {shlex.quote(h)}" for h in [*header, *WHOLE_NODES, *nodelist_args(spec)]]


def render_sbatch(spec: LaunchSpec, mpi: str | None = None) -> str:
    return "\n".join(["#!/bin/bash", *sbatch_header(spec, len(spec.nodes[0].ranks)),
                      f"# topoplan launch: {spec.layout}, {spec.world} rank(s)", "set -euo pipefail",
                      *srun_lines(spec, cluster_options=False, mpi=mpi)]) + "\n"
