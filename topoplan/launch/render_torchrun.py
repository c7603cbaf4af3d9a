"""`--format torchrun`: one torchrun line per node, with the per-rank binding wrapper.

torchrun binds local rank i to GPU i only through the user's `set_device(LOCAL_RANK)`, its
`--numa-binding` binds CPUs only and assumes GPU i for local rank i, and it sets OMP_NUM_THREADS=1. So
torchrun starts our wrapper (`--no-python`), which picks the rank's env and numactl line by RANK.

Rendezvous is static (`--master-addr/--master-port` with `--node-rank`, torchrun's default backend): node n
then runs exactly ranks n*k .. n*k+k-1, so every rank lands on the host and GPU the plan chose. With
`--rdzv-backend=c10d` the rendezvous, not `--node-rank`, decides which host gets which ranks
(torch.distributed.elastic: the node rank is ignored by dynamic backends), and the placement could land on
the wrong node.
"""

from __future__ import annotations

import shlex

from topoplan.launch.dispatch import SHEBANG, dispatch_argv, env_words
from topoplan.launch.spec import LAUNCHER_VARS, RENDEZVOUS_VARS, LaunchSpec, require_master_addr, require_node_blocks


def render_torchrun(spec: LaunchSpec) -> str:
    per_node = require_node_blocks(spec, "torchrun")
    master = require_master_addr(spec, "torchrun")
    skip = (*LAUNCHER_VARS, *RENDEZVOUS_VARS)  # torchrun sets these itself
    wrapper = dispatch_argv("RANK", {r.rank: [*env_words(r.env_dict(skip)), *r.binding_argv()]
                                     for r in spec.ranks})
    out = [SHEBANG, f"# topoplan launch: {spec.layout}, {spec.world} rank(s), {per_node} per node on "
                    f"{len(spec.nodes)} node(s); static rendezvous: node n runs ranks n*{per_node}.."]
    for node in spec.nodes:
        out.append(f"# node {node.index}" + (f": run on {shlex.quote(node.host)}" if node.host else ""))
        out.append(shlex.join([
            "torchrun", f"--nnodes={len(spec.nodes)}", f"--node-rank={node.index}", f"--nproc-per-node={per_node}",
            f"--master-addr={master}", f"--master-port={spec.master_port}",
            "--no-python", *wrapper, *spec.command]))
    return "\n".join(out) + "\n"
