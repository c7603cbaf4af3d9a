"""`--format json`: the whole spec for other tools, every variable with its reason.

Contract (extra keys may be added, these stay): {"ranks": [{"rank", "node", "local_rank", "gpu", "cpus",
"mem_node", "mem_policy", "cpu_node", "env", "reasons", "command"}], "nodes": [...], "commands": [...],
"device"} where "commands" are the shell-format lines that start the job. "cpu_node" is the NUMA node whose
CPUs a rank is bound to when no CPU list is known ("cpus" null); "mem_policy" is preferred, bind or none.
"""

from __future__ import annotations

import json

from topoplan.launch.render_shell import render_shell
from topoplan.launch.spec import LaunchSpec


def spec_dict(spec: LaunchSpec) -> dict:
    return {
        "layout": {"tp": spec.layout.tp, "pp": spec.layout.pp, "dp": spec.layout.dp, "ep": spec.layout.ep},
        "master_addr": spec.master_addr,
        "master_port": spec.master_port,
        "device": spec.device,
        "ranks": [{
            "rank": r.rank, "node": r.node, "local_rank": r.local_rank,
            "tp_rank": r.tp_rank, "pp_rank": r.pp_rank, "dp_rank": r.dp_rank,
            "gpu": r.gpu, "gpu_index": r.gpu_index, "pci_bus_id": r.pci_bus_id, "uuid": r.uuid,
            "cuda_index": r.cuda_index,
            "cpus": list(r.cpus) if r.cpus is not None else None, "physical_cores": r.physical_cores,
            "mem_node": r.mem_node, "mem_node_reason": r.mem_reason, "mem_policy": r.mem_policy,
            "cpu_node": r.cpu_node, "cpus_reason": r.cpu_reason,
            "env": r.env_dict(), "reasons": r.reasons(),
            "command": spec.rank_argv(r),
        } for r in spec.ranks],
        "nodes": [{"node": n.index, "host": n.host, "ranks": list(n.ranks),
                   "cuda_visible_devices": n.cuda_visible_devices} for n in spec.nodes],
        "commands": ([line for line in render_shell(spec).splitlines() if line and not line.startswith("#")]
                     if spec.master_addr is not None else []),  # several nodes without --hosts: no rendezvous yet
        "notes": list(spec.notes),
    }


def render_json(spec: LaunchSpec) -> str:
    return json.dumps(spec_dict(spec), indent=2) + "\n"
