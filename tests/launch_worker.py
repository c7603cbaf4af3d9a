"""A tiny rank for the launch tests: checks its own environment and binding against the spec, then
all-reduces its rank over gloo. Usage: python launch_worker.py SPEC.json OUT_DIR

It finds its rank the way the runner does (topoplan.rank_env), so whichever launcher started it works.
Writes OUT_DIR/rank<N>.json with what it saw; exits 1 when a check fails.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from topoplan.rank_env import discover_rank_env

OWNED_BY_LAUNCHER = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"}


def memory_policy() -> set[str]:
    """Policies of this process's mappings as /proc/self/numa_maps shows them ("bind:0", "local", ...)."""
    return {line.split()[1] for line in Path("/proc/self/numa_maps").read_text().splitlines() if line.strip()}


def main(spec_path: str, out_dir: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    me = discover_rank_env()
    planned = spec["ranks"][me.rank]
    failures = []
    seen = {"rank": me.rank, "world": me.world_size, "local_rank": me.local_rank, "launcher": me.launcher,
            "affinity": sorted(os.sched_getaffinity(0)), "policy": sorted(memory_policy()),
            "env": {k: os.environ.get(k) for k in planned["env"]}}
    if (me.world_size, me.local_rank) != (len(spec["ranks"]), planned["local_rank"]):
        failures.append(f"world/local rank {me.world_size}/{me.local_rank}, planned "
                        f"{len(spec['ranks'])}/{planned['local_rank']}")
    for name, value in planned["env"].items():
        if name in OWNED_BY_LAUNCHER or (me.launcher in ("torchrun", "slurm") and name.startswith("MASTER_")):
            continue  # the launcher's numbering was checked above; Slurm's script reads node 0 from the allocation
        if os.environ.get(name) != value:
            failures.append(f"{name}={os.environ.get(name)!r}, planned {value!r}")
    if planned["cpus"] is not None and seen["affinity"] != planned["cpus"]:
        failures.append(f"affinity {seen['affinity']}, planned {planned['cpus']}")
    tag = {"bind": "bind", "preferred": "prefer"}.get(planned["mem_policy"])  # numa_maps' names
    if planned["mem_node"] is not None and tag and f"{tag}:{planned['mem_node']}" not in seen["policy"]:
        failures.append(f"memory policy {seen['policy']}, planned {tag}:{planned['mem_node']}")

    import torch
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", me.master_addr)
    os.environ.setdefault("MASTER_PORT", str(me.master_port))
    dist.init_process_group("gloo", init_method="env://", rank=me.rank, world_size=me.world_size)
    total = torch.tensor([me.rank], dtype=torch.int64)
    dist.all_reduce(total)
    dist.destroy_process_group()
    seen["sum"] = int(total.item())
    if seen["sum"] != me.world_size * (me.world_size - 1) // 2:
        failures.append(f"all-reduce of ranks gave {seen['sum']}")
    seen["failures"] = failures
    Path(out_dir, f"rank{me.rank}.json").write_text(json.dumps(seen))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
