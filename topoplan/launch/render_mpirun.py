"""`--format mpirun` (Open MPI): one MPMD app context per rank, in rank order, each with its host, its
variables as `-x` and its numactl binding; `--bind-to none` so Open MPI's own binding does not fight it.

Open MPI numbers app contexts' processes in order, so context i is MPI rank i, and the runner reads
OMPI_COMM_WORLD_RANK (topoplan.rank_env); RANK/LOCAL_RANK/WORLD_SIZE are therefore not exported.

Remote ranks start from a fresh login environment (orted over ssh): without the launching shell's PATH,
LD_LIBRARY_PATH, PYTHONPATH and VIRTUAL_ENV they would find another python, or none of our packages. So the
script forwards those that are set (`-x NAME`; Open MPI warns about unset ones). As root, mpirun refuses to
start unless OMPI_ALLOW_RUN_AS_ROOT=1 and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 are set; `--allow-run-as-root`
makes the script export them (a choice for containers; it is not made silently).
"""

from __future__ import annotations

from topoplan.launch.dispatch import SHEBANG, continued
from topoplan.launch.spec import LAUNCHER_VARS, LaunchSpec, require_master_addr

FORWARDED = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV")
FORWARD_LINE = (f"forward=(); for name in {' '.join(FORWARDED)}; do "
                '[ -n "${!name+set}" ] && forward+=(-x "$name"); done')
ROOT_LINES = ["# running as root (e.g. in a container): Open MPI refuses without both variables",
              "export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"]


def render_mpirun(spec: LaunchSpec) -> str:
    require_master_addr(spec, "mpirun")
    groups: list[list[str]] = []
    for r in spec.ranks:
        node = spec.nodes[r.node]
        exports = [w for name, value in r.env_dict(LAUNCHER_VARS).items() for w in ("-x", f"{name}={value}")]
        host = f"{node.host or 'localhost'}:{len(node.ranks)}"
        groups.append([*([":"] if r.rank else []), "-np", "1", "-H", host, *exports,
                       *spec.rank_argv(r)])
    out = [SHEBANG, f"# topoplan launch: {spec.layout}, {spec.world} rank(s) on {len(spec.nodes)} node(s)",
           *(ROOT_LINES if spec.launcher.allow_run_as_root else []),
           f"# every rank gets the launching shell's {', '.join(FORWARDED)} (those that are set)", FORWARD_LINE]
    return "\n".join(out) + '\nmpirun --bind-to none "${forward[@]}" \\\n    ' + continued(groups) + "\n"
