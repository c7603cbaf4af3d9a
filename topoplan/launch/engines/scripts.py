"""Write an engine launch as a shell script, Slurm lines or JSON (formatting only: engine modules decide).

`--format shell` is a bash script that serves in the foreground: the server (node 0's process; with several nodes,
the node named by TOPOPLAN_NODE) runs as a background job in its own process group (`set -m`), the script waits
for it, and Ctrl-C or a TERM to the script sends TERM to that whole group - the server and every worker it
started - then KILL after a grace period; when the server exits by itself, whatever it left in its group is
ended too. Either way the engine's /dev/shm files that the group had mapped are unlinked (shm_cleanup). The
script exits with the server's status (130/143 after a signal).

`--format srun|sbatch`: one task per node (`--ntasks-per-node=1`, the engine starts its own workers) running a
wrapper keyed on SLURM_NODEID that sets that node's variables and `--node-rank`; TRT-LLM over several nodes is
one MPI task per rank instead (`srun --mpi=pmix`, per-rank binding as for the bundled runner). The script reads
the allocation for node 0's address (topoplan.launch.render_slurm, topoplan.launch.runtime_addr), starts the step
in the background, waits for the engine's health endpoint (topoplan.launch.engines.health), prints the URL and
exits with the step's status.
"""

from __future__ import annotations

import json
import shlex

from topoplan.errors import TopoplanError, printable
from topoplan.launch.dispatch import SHEBANG, dispatch_argv, env_words
from topoplan.launch.engines.common import EngineLaunch, NodeCommand
from topoplan.launch.engines.health import wait_lines
from topoplan.launch.engines.render_lws import render_lws
from topoplan.launch.engines.shm_cleanup import SHM_FUNCTIONS
from topoplan.launch.render_json import spec_dict
from topoplan.launch.render_mpirun import render_mpirun
from topoplan.launch.render_slurm import allocation_lines, nodelist_args, salloc_hint, sbatch_header, srun_lines
from topoplan.launch.requires import argv_programs, require_lines
from topoplan.launch.runtime_addr import (
    FILES_VAR,
    HEAD,
    HEAD_VAR,
    IFNAME_GUARD,
    IFNAME_VAR,
    needs_ifname,
    shell_join,
)

GRACE_S = 30  # seconds between TERM and KILL: an engine saves nothing, but its workers take a moment to exit
STOP = "\n".join([
    SHM_FUNCTIONS,
    "stop() {  # TERM the server's whole process group, KILL what is left after the grace period",
    '  [ -n "${server:-}" ] || exit "$1"',
    "  note_shm",
    '  kill -TERM -- "-$server" 2>/dev/null',
    f"  for ((i = 0; i < {GRACE_S * 5}; i++)); do",
    '    kill -0 -- "-$server" 2>/dev/null || { remove_shm; exit "$1"; }',
    "    sleep 0.2",
    "  done",
    '  kill -KILL -- "-$server" 2>/dev/null',
    "  remove_shm",
    '  exit "$1"',
    "}",
    "trap 'stop 130' INT",
    "trap 'stop 143' TERM",
])
WAIT = "\n".join([
    'wait "$server"',
    "status=$?",
    "note_shm",
    'kill -TERM -- "-$server" 2>/dev/null  # the server is gone: end anything it left in its group',
    "remove_shm",
    'exit "$status"',
])
ENGINE_FORMATS = ("shell", "srun", "sbatch", "json", "lws")
# Per-rank placement facts in the JSON (the engine sets its workers' variables itself; see "nodes")
RANK_KEYS = ("rank", "node", "local_rank", "tp_rank", "pp_rank", "dp_rank", "gpu", "gpu_index", "cuda_index", "cpus",
             "physical_cores", "mem_node")


def _line(command: NodeCommand) -> str:
    return shell_join([*env_words(command.env_dict()), *command.argv]) + " &"


def requires(launch: EngineLaunch) -> list[str]:
    """Checks of the engine's Python (and any wrapper) and of a checkpoint given as a local path."""
    return require_lines([p for c in launch.nodes for p in argv_programs(c.argv)], [launch.options.checkpoint])


def ifname_lines(launch: EngineLaunch) -> list[str]:
    """Where the lines name the interface to the other nodes (topoplan.launch.engines.common.network_env): its
    default from --ifname, or a guard that stops the script until TOPOPLAN_IFNAME is set; exported for srun."""
    return ifname_guard([w for c in launch.nodes for w in (*c.argv, *(v.value for v in c.env))],
                        launch.options.ifname)


def ifname_guard(words: list[str], given: str | None) -> list[str]:
    """ifname_lines for any lines made of these words."""
    if not needs_ifname(words):
        return []
    if given:
        return [f'export {IFNAME_VAR}="${{{IFNAME_VAR}:-{given}}}"  # --ifname: the interface to the other nodes']
    return [IFNAME_GUARD, f"export {IFNAME_VAR}"]


def files_lines(launch: EngineLaunch) -> list[str]:
    """Lines writing the launch's option files (EngineLaunch.files) into a new folder when the script runs: the
    script carries them, so it works wherever it is copied (sbatch runs a spooled copy)."""
    if not launch.files:
        return []
    out = [f'{FILES_VAR}="$(mktemp -d)"  # the engine option files, written below',
           f'trap \'rm -rf "${FILES_VAR}"\' EXIT  # and removed when the script ends']
    for name, text in launch.files:
        out += [f"cat > \"${FILES_VAR}\"/{shlex.quote(name)} <<'TOPOPLAN_EOF'", text.rstrip("\n"), "TOPOPLAN_EOF"]
    return out


def _header(launch: EngineLaunch) -> list[str]:
    spec = launch.spec
    url = launch.url.replace(HEAD, f"${HEAD_VAR}")
    # a comment stays one comment line whatever the checkpoint path holds (a newline would start a command)
    return [SHEBANG,
            printable(f"# topoplan launch: {launch.engine.name} serving {launch.options.checkpoint} with "
                      f"{spec.layout}, {spec.world} rank(s) on {len(spec.nodes)} node(s); HTTP on {url} (node 0)"),
            printable(f"# {launch.device_mapping}")]


def render_serve_script(launch: EngineLaunch) -> str:
    if not launch.nodes:  # TRT-LLM over several nodes: one MPI process per rank, started from node 0
        return render_mpirun(launch.spec)
    out = [*_header(launch), "set -m  # the server gets its own process group, so one signal reaches all it started",
           STOP, *requires(launch), *ifname_lines(launch), *files_lines(launch)]
    if len(launch.nodes) == 1:
        out.append(_line(launch.nodes[0]))
    else:
        out.append(': "${TOPOPLAN_NODE:?set TOPOPLAN_NODE to the node index of this host, 0 for node 0}"')
        out.append('case "$TOPOPLAN_NODE" in')
        for command in launch.nodes:
            host = launch.spec.nodes[command.node].host
            out.append(f"  {command.node})  # node {command.node}" + (f": {shlex.quote(host)}" if host else "")
                       + (" serves HTTP" if command.serves else " runs workers only"))
            out.append(f"    {_line(command)}")
            out.append("    ;;")
        out.append('  *) echo "topoplan: no node $TOPOPLAN_NODE in this launch" >&2; exit 2 ;;')
        out.append("esac")
    out += ["server=$!", WAIT]
    return "\n".join(out) + "\n"


def _step(launch: EngineLaunch, cluster_options: bool) -> list[str]:
    """The allocation lines and the srun line that starts the engine, ending in ` &` (the health wait follows)."""
    spec = launch.spec
    if not launch.nodes:  # TRT-LLM over several nodes: one MPI task per rank, bound per rank
        *lines, srun = srun_lines(spec, cluster_options=cluster_options, mpi="pmix")
        return [*lines, "# every rank is an MPI task; MPI rank 0 serves HTTP", srun + " &"]
    wrapper = dispatch_argv("SLURM_NODEID", {c.node: [*env_words(c.env_dict()), *c.argv] for c in launch.nodes},
                            join=shell_join)
    args = ["srun", *(spec.launcher.slurm_args() if cluster_options else []), f"--nodes={len(spec.nodes)}",
            "--ntasks-per-node=1", "--cpu-bind=none", "--export=ALL", *nodelist_args(spec)]
    return [*allocation_lines(len(spec.nodes)), "# the engine starts its own workers: one task per node",
            shell_join([*args, *wrapper]) + " &"]


def _serve_step(launch: EngineLaunch, cluster_options: bool) -> list[str]:
    options = launch.options
    return ["set -euo pipefail", *ifname_lines(launch), *files_lines(launch), *_step(launch, cluster_options),
            "server=$!",
            "trap 'kill -TERM \"$server\" 2>/dev/null' INT TERM  # srun passes the signal to every task",
            *wait_lines(launch.engine.name, options.host, options.port, launch.url)]


def render_engine_srun(launch: EngineLaunch) -> str:
    hint = f"# run inside an allocation of whole nodes: {salloc_hint(len(launch.spec.nodes))} bash SCRIPT"
    return "\n".join([*_header(launch), hint, *_serve_step(launch, cluster_options=True)]) + "\n"


def render_engine_sbatch(launch: EngineLaunch) -> str:
    spec = launch.spec
    tasks = len(spec.nodes[0].ranks) if not launch.nodes else 1  # MPI ranks (TRT-LLM over nodes), else one server
    return "\n".join(["#!/bin/bash", *sbatch_header(spec, tasks, job_name="topoplan-" + launch.engine.name),
                      *_header(launch)[1:], *_serve_step(launch, cluster_options=False)]) + "\n"


def engine_dict(launch: EngineLaunch) -> dict:
    """The JSON contract: the engine, its URL, per node its argv, environment and chosen options with reasons, and
    the spec's per-rank facts (GPU, CPUs, NUMA node) the commands were derived from."""
    return {
        "engine": launch.engine.name, "url": launch.url, "device": launch.options.device,
        "device_mapping": launch.device_mapping,
        "layout": {"tp": launch.spec.layout.tp, "pp": launch.spec.layout.pp, "dp": launch.spec.layout.dp},
        "nodes": [{"node": c.node, "host": launch.spec.nodes[c.node].host, "serves": c.serves, "argv": list(c.argv),
                   "env": c.env_dict(), "reasons": {v.name: v.reason for v in c.env},
                   "options": [{"words": list(o.words), "reason": o.reason} for o in c.options]} for c in launch.nodes],
        "ranks": [{k: r[k] for k in RANK_KEYS} for r in spec_dict(launch.spec)["ranks"]],
        "commands": [line for line in render_serve_script(launch).splitlines() if line and not line.startswith("#")],
        "notes": [*launch.notes, *launch.spec.notes],
    }


def render_engine(launch: EngineLaunch, fmt: str) -> str:
    formats = (*ENGINE_FORMATS, "mpirun") if not launch.nodes else ENGINE_FORMATS
    if fmt not in formats:
        raise TopoplanError(f"--format {fmt} with --engine {launch.engine.name}: the engine starts its own workers, so "
                            f"expected one of {', '.join(formats)}")
    if fmt == "json":
        return json.dumps(engine_dict(launch), indent=2) + "\n"
    if fmt == "lws":
        return render_lws(launch)
    if fmt == "srun":
        return render_engine_srun(launch)
    if fmt == "sbatch":
        return render_engine_sbatch(launch)
    return render_serve_script(launch)
