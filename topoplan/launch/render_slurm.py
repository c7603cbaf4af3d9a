"""`--format srun|sbatch`: Slurm binds each task itself, by local task id, with one map for every node.

- `--gpu-bind=map_gpu:` gives local task i its planned GPU (Slurm then sets CUDA_VISIBLE_DEVICES, on AMD GPUs
  ROCR_VISIBLE_DEVICES, to that one
  GPU, so the rank's device is cuda:0); `--cpu-bind=mask_cpu:` and `--mem-bind=map_mem:` bind before the
  program starts.
- Slurm's GPU ids follow gres.conf; with `AutoDetect=nvml` and whole nodes (`--exclusive`, all GPUs) they
  are the nvidia-smi (PCI bus) indices the plan uses. That is the assumption here.
- Per-rank variables Slurm cannot map (OMP_NUM_THREADS, NCCL_IB_HCA) are set by a small wrapper keyed on
  SLURM_LOCALID. Slurm sets the rank variables (SLURM_PROCID, ...) that topoplan.rank_env reads.
"""

from __future__ import annotations

import shlex

from topoplan.errors import TopoplanError
from topoplan.launch.device_env import VISIBLE_DEVICES
from topoplan.launch.dispatch import SHEBANG, dispatch_argv, env_words
from topoplan.launch.spec import LAUNCHER_VARS, RENDEZVOUS_VARS, LaunchSpec, RankSpec, require_node_blocks

FIRST_NODE = '"$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"'
_SLURM_SETS = (*LAUNCHER_VARS, *RENDEZVOUS_VARS, *VISIBLE_DEVICES.values())  # Slurm's GPU binding sets them


def _local_binding(r: RankSpec) -> tuple:
    return r.gpu_index, r.cpus, r.mem_node, tuple(r.env_dict(_SLURM_SETS).items())


def _check_same_on_every_node(spec: LaunchSpec, per_node: int) -> list[RankSpec]:
    first = spec.node_ranks(0)
    for node in spec.nodes[1:]:
        for a, b in zip(first, spec.node_ranks(node.index)):
            if _local_binding(a) != _local_binding(b):
                raise TopoplanError(
                    f"Slurm applies one --gpu-bind/--cpu-bind map to every node, but local rank {a.local_rank} is "
                    f"bound differently on node 0 ({a.gpu}) and node {node.index} ({b.gpu}); use --format mpirun "
                    "or shell for this placement")
    return first


def _mask(cpus: tuple[int, ...]) -> str:
    return hex(sum(1 << c for c in cpus))


def srun_lines(spec: LaunchSpec) -> list[str]:
    per_node = require_node_blocks(spec, "srun")
    local = _check_same_on_every_node(spec, per_node)
    master = shlex.quote(spec.master_addr) if spec.master_addr is not None else FIRST_NODE
    args = ["srun", f"--nodes={len(spec.nodes)}", f"--ntasks={spec.world}", f"--ntasks-per-node={per_node}"]
    hosts = [n.host for n in spec.nodes]
    if all(hosts):
        args.append(f"--nodelist={','.join(hosts)}")  # type: ignore[arg-type]
    args += ["--distribution=block", f"--gpu-bind=map_gpu:{','.join(str(r.gpu_index) for r in local)}"]
    if all(r.cpus for r in local):
        args.append(f"--cpu-bind=mask_cpu:{','.join(_mask(r.cpus) for r in local)}")  # type: ignore[arg-type]
    else:
        args.append("--cpu-bind=none")
    if all(r.mem_node is not None for r in local):
        args.append(f"--mem-bind=map_mem:{','.join(str(r.mem_node) for r in local)}")
    else:
        args.append("--mem-bind=local")
    args.append("--export=ALL")
    wrapper = dispatch_argv("SLURM_LOCALID", {r.local_rank: env_words(r.env_dict(_SLURM_SETS)) for r in local})
    return [f"export MASTER_ADDR={master}", f"export MASTER_PORT={spec.master_port}",
            shlex.join([*args, *wrapper, *spec.command])]


def render_srun(spec: LaunchSpec) -> str:
    return "\n".join([SHEBANG, f"# topoplan launch: {spec.layout}, {spec.world} rank(s) on {len(spec.nodes)} node(s); "
                                f"run "
                      "inside an allocation of whole nodes (salloc --exclusive)", *srun_lines(spec)]) + "\n"


def render_sbatch(spec: LaunchSpec, job_name: str = "topoplan") -> str:
    per_node = len(spec.nodes[0].ranks)
    header = [f"--job-name={job_name}", f"--nodes={len(spec.nodes)}", f"--ntasks-per-node={per_node}",
              f"--gres=gpu:{spec.gpus_per_node}", "--exclusive"]
    if all(n.host for n in spec.nodes):
        header.append(f"--nodelist={','.join(n.host for n in spec.nodes)}")  # type: ignore[misc]
    return "\n".join(["#!/bin/bash", *(f"#SBATCH {shlex.quote(h)}" for h in header),
                      f"# topoplan launch: {spec.layout}, {spec.world} rank(s)", "set -euo pipefail",
                      *srun_lines(spec)]) + "\n"
