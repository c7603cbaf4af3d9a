"""Write an engine launch as a shell script, Slurm lines or JSON (formatting only: engine modules decide).

`--format shell` is a bash script that serves in the foreground: the server (node 0's process; with several nodes,
the node named by TOPOPLAN_NODE) runs as a background job in its own process group (`set -m`), the script waits
for it, and Ctrl-C or a TERM to the script sends TERM to that whole group - the server and every worker it
started - then KILL after a grace period; when the server exits by itself, whatever it left in its group is
ended too. The script exits with the server's status (130/143 after a signal).

`--format srun|sbatch`: one task per node (`--ntasks-per-node=1`, the engine starts its own workers) running a
wrapper keyed on SLURM_NODEID that sets that node's variables and `--node-rank`; TRT-LLM over several nodes is
one MPI task per rank instead (`srun --mpi=pmix`, per-rank binding as for the bundled runner).
"""

from __future__ import annotations

import json
import shlex

from topoplan.errors import TopoplanError, printable
from topoplan.launch.dispatch import SHEBANG, dispatch_argv, env_words
from topoplan.launch.engines.common import EngineLaunch, NodeCommand
from topoplan.launch.render_json import spec_dict
from topoplan.launch.render_mpirun import render_mpirun
from topoplan.launch.render_slurm import FIRST_NODE, render_sbatch, render_srun

GRACE_S = 30  # seconds between TERM and KILL: an engine saves nothing, but its workers take a moment to exit
STOP = "\n".join([
    "stop() {  # TERM the server's whole process group, KILL what is left after the grace period",
    '  [ -n "${server:-}" ] || exit "$1"',
    '  kill -TERM -- "-$server" 2>/dev/null',
    f"  for ((i = 0; i < {GRACE_S * 5}; i++)); do",
    '    kill -0 -- "-$server" 2>/dev/null || exit "$1"',
    "    sleep 0.2",
    "  done",
    '  kill -KILL -- "-$server" 2>/dev/null',
    '  exit "$1"',
    "}",
    "trap 'stop 130' INT",
    "trap 'stop 143' TERM",
])
WAIT = "\n".join([
    'wait "$server"',
    "status=$?",
    'kill -TERM -- "-$server" 2>/dev/null  # the server is gone: end anything it left in its group',
    'exit "$status"',
])
SHELL_FORMATS = ("shell", "srun", "sbatch", "json")
# Per-rank placement facts in the JSON (the engine sets its workers' variables itself; see "nodes")
RANK_KEYS = ("rank", "node", "local_rank", "tp_rank", "pp_rank", "dp_rank", "gpu", "gpu_index", "cuda_index", "cpus",
             "physical_cores", "mem_node")


def _line(command: NodeCommand) -> str:
    return shlex.join([*env_words(command.env_dict()), *command.argv]) + " &"


def _header(launch: EngineLaunch) -> list[str]:
    spec = launch.spec
    # a comment stays one comment line whatever the checkpoint path holds (a newline would start a command)
    return [SHEBANG,
            printable(f"# topoplan launch: {launch.engine} serving {launch.options.checkpoint} with {spec.layout}, "
                      f"{spec.world} rank(s) on {len(spec.nodes)} node(s); HTTP on {launch.url} (node 0)"),
            printable(f"# {launch.device_mapping}")]


def render_serve_script(launch: EngineLaunch) -> str:
    if not launch.nodes:  # TRT-LLM over several nodes: one MPI process per rank, started from node 0
        return render_mpirun(launch.spec)
    out = [*_header(launch), "set -m  # the server gets its own process group, so one signal reaches all it started",
           STOP]
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


def _srun_line(launch: EngineLaunch) -> list[str]:
    spec = launch.spec
    master = shlex.quote(spec.master_addr) if spec.master_addr is not None else FIRST_NODE
    wrapper = dispatch_argv("SLURM_NODEID", {c.node: [*env_words(c.env_dict()), *c.argv] for c in launch.nodes})
    args = ["srun", f"--nodes={len(spec.nodes)}", "--ntasks-per-node=1", "--cpu-bind=none", "--export=ALL"]
    hosts = [n.host for n in spec.nodes]
    if all(hosts):
        args.append(f"--nodelist={','.join(hosts)}")  # type: ignore[arg-type]
    return [f"# the engine starts its own workers: one task per node; node 0 ({master}) serves {launch.url}",
            shlex.join([*args, *wrapper])]


def render_engine_srun(launch: EngineLaunch) -> str:
    if not launch.nodes:
        return render_srun(launch.spec, mpi="pmix")
    return "\n".join([*_header(launch), *_srun_line(launch)]) + "\n"


def render_engine_sbatch(launch: EngineLaunch) -> str:
    if not launch.nodes:
        return render_sbatch(launch.spec, mpi="pmix")
    spec = launch.spec
    header = ["--job-name=topoplan-" + launch.engine, f"--nodes={len(spec.nodes)}", "--ntasks-per-node=1",
              f"--gres=gpu:{spec.gpus_per_node}", "--exclusive"]
    if all(n.host for n in spec.nodes):
        header.append(f"--nodelist={','.join(n.host for n in spec.nodes)}")  # type: ignore[misc]
    return "\n".join(["#!/bin/bash", *(f"#SBATCH {shlex.quote(h)}" for h in header), *_header(launch)[1:],
                      "set -euo pipefail", *_srun_line(launch)]) + "\n"


def engine_dict(launch: EngineLaunch) -> dict:
    """The JSON contract: the engine, its URL, per node its argv and environment with reasons, and the spec's
    per-rank facts (GPU, CPUs, NUMA node) the commands were derived from."""
    return {
        "engine": launch.engine, "url": launch.url, "device": launch.options.device,
        "device_mapping": launch.device_mapping,
        "layout": {"tp": launch.spec.layout.tp, "pp": launch.spec.layout.pp, "dp": launch.spec.layout.dp},
        "nodes": [{"node": c.node, "host": launch.spec.nodes[c.node].host, "serves": c.serves, "argv": list(c.argv),
                   "env": c.env_dict(), "reasons": {v.name: v.reason for v in c.env}} for c in launch.nodes],
        "ranks": [{k: r[k] for k in RANK_KEYS} for r in spec_dict(launch.spec)["ranks"]],
        "commands": [line for line in render_serve_script(launch).splitlines() if line and not line.startswith("#")],
        "notes": [*launch.notes, *launch.spec.notes],
    }


def render_engine(launch: EngineLaunch, fmt: str) -> str:
    formats = (*SHELL_FORMATS, "mpirun") if not launch.nodes else SHELL_FORMATS
    if fmt not in formats:
        raise TopoplanError(f"--format {fmt} with --engine {launch.engine}: the engine starts its own workers, so "
                            f"expected one of {', '.join(formats)}")
    if fmt == "json":
        return json.dumps(engine_dict(launch), indent=2) + "\n"
    if fmt == "srun":
        return render_engine_srun(launch)
    if fmt == "sbatch":
        return render_engine_sbatch(launch)
    return render_serve_script(launch)
