"""`--format mpirun` (Open MPI): one MPMD app context per rank, in rank order, each with its host, its
variables as `-x` and its numactl binding; `--bind-to none` so Open MPI's own binding does not fight it.

Open MPI numbers app contexts' processes in order, so context i is MPI rank i, and the runner reads
OMPI_COMM_WORLD_RANK (topoplan.rank_env); RANK/LOCAL_RANK/WORLD_SIZE are therefore not exported.
"""

from __future__ import annotations

from topoplan.launch.dispatch import SHEBANG, continued
from topoplan.launch.spec import LAUNCHER_VARS, LaunchSpec, require_master_addr


def render_mpirun(spec: LaunchSpec) -> str:
    require_master_addr(spec, "mpirun")
    groups: list[list[str]] = [["mpirun", "--bind-to", "none"]]
    for r in spec.ranks:
        node = spec.nodes[r.node]
        exports = [w for name, value in r.env_dict(LAUNCHER_VARS).items() for w in ("-x", f"{name}={value}")]
        host = f"{node.host or 'localhost'}:{len(node.ranks)}"
        groups.append([*([":"] if r.rank else []), "-np", "1", "-H", host, *exports,
                       *spec.rank_argv(r)])
    return f"{SHEBANG}\n# topoplan launch: {spec.layout}, {spec.world} rank(s) on {len(spec.nodes)} node(s)\n" \
           + continued(groups) + "\n"
