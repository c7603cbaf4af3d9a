"""Write a disaggregated launch (topoplan.launch.engines.disagg) as a shell script, a Slurm batch script or JSON
(formatting only: the engine modules decide the lines; topoplan.launch.engines.disagg_lws writes the
LeaderWorkerSet, each pod running this script for its node).

`--format shell`: one bash script per deployment, run on every node of it (TOPOPLAN_NODE names the node when the
plan spans several). It starts this node's workers, each an engine server in its own process group (`set -m`); node 0
then waits until every worker of every node answers GET /health, starts the router, waits for it, and prints the URL.
The script stays in the foreground: Ctrl-C or TERM ends every server's whole group (TERM, then KILL after a grace
period), and when any server exits the script ends the others and exits with that server's status.

`--format sbatch` (and `srun`, the same step to run inside an allocation): the same script, run by one Slurm task
per node (`srun --ntasks-per-node=1`) with TOPOPLAN_NODE
from SLURM_NODEID and every node's address read from the allocation; the batch script waits for the router's health
endpoint (topoplan.launch.engines.health) and prints its URL.
"""

from __future__ import annotations

import json
import shlex

from topoplan.errors import TopoplanError, printable
from topoplan.launch.dispatch import SHEBANG, env_words
from topoplan.launch.engines.disagg import NODE_ADDR_RE, NODE_ADDR_VAR, NODE_VAR, DisaggLaunch, Process
from topoplan.launch.engines.health import HEALTH_TIMEOUT_S, POLL_S, probe_words, wait_lines
from topoplan.launch.engines.scripts import GRACE_S, ifname_guard
from topoplan.launch.render_slurm import WHOLE_NODES, allocation_lines, salloc_hint
from topoplan.launch.requires import argv_programs, require_lines
from topoplan.launch.runtime_addr import ALL_INTERFACES, shell_join, shell_word

DISAGG_FORMATS = ("shell", "srun", "sbatch", "json", "lws")


def _word(word: str) -> str:
    """shell_word, with each node address placeholder written as its variable ("$TOPOPLAN_NODE<n>_ADDR")."""
    parts = NODE_ADDR_RE.split(word)
    out = [f'"${NODE_ADDR_VAR.format(node=part)}"' if i % 2 else shell_word(part) for i, part in enumerate(parts)
           if i % 2 or part]
    return "".join(out) or "''"


def _join(words: list[str] | tuple[str, ...]) -> str:
    return " ".join(_word(w) for w in words)


def _words(launch: DisaggLaunch) -> list[str]:
    return [w for p in launch.processes for w in (*p.argv, *(v.value for v in p.env))]


def _describe(p: Process) -> str:
    if p.role == "router":
        return f"# router: HTTP {p.port}"
    nics = ", ".join(f"{g} -> {n or 'no NIC'}" for g, n in zip(p.gpus, p.nics))
    return printable(f"# {p.name}: node {p.node}, HTTP {p.port}, KV NICs {nics}")


def _header(launch: DisaggLaunch) -> list[str]:
    prefill, decode = launch.plan.ratio
    return [printable(f"# topoplan launch --disagg: {launch.engine.name} serving {launch.options.checkpoint}: "
                      f"{prefill} prefill worker(s) ({launch.plan.prefill}) and {decode} decode worker(s) "
                      f"({launch.plan.decode}) on {launch.nodes} node(s); HTTP on {launch.url} (the router, node 0)"),
            printable(f"# router: {launch.router_label}"),
            *(printable(f"# note: {note}") for note in launch.notes)]


def _address_lines(launch: DisaggLaunch) -> list[str]:
    """Multi-node: each node's address, from --hosts as a default, else asked for."""
    if launch.nodes < 2:
        return []
    out = []
    for node, host in enumerate(launch.hosts):
        var = NODE_ADDR_VAR.format(node=node)
        if host:
            out.append(f'[ -n "${{{var}:-}}" ] || {var}={shlex.quote(host)}; export {var}  # --hosts: node {node}')
        else:
            out.append(f': "${{{var}:?set {var} to the address of node {node} (or write the lines again with '
                       '--hosts)}"')
    return out


def _stop() -> str:
    return "\n".join([
        "servers=()",
        "stop() {  # TERM every server's process group, KILL what is left after the grace period",
        "  trap '' INT TERM",
        '  local s i alive',
        '  for s in "${servers[@]}"; do kill -TERM -- "-$s" 2>/dev/null; done',
        f"  for ((i = 0; i < {GRACE_S * 5}; i++)); do",
        "    alive=0",
        '    for s in "${servers[@]}"; do kill -0 -- "-$s" 2>/dev/null && alive=1; done',
        '    [ "$alive" = 0 ] && exit "$1"',
        "    sleep 0.2",
        "  done",
        '  for s in "${servers[@]}"; do kill -KILL -- "-$s" 2>/dev/null; done',
        '  exit "$1"',
        "}",
        "trap 'stop 130' INT",
        "trap 'stop 143' TERM",
    ])


def _health() -> str:
    timeout = f"${{TOPOPLAN_HEALTH_TIMEOUT:-{HEALTH_TIMEOUT_S}}}"
    return "\n".join([
        f"topoplan_deadline=$((SECONDS + {timeout}))",
        "topoplan_wait() {  # NAME HOST PORT: until GET /health answers 200; stop all when a server exits first",
        "  local s",
        "  until " + shell_join(probe_words()) + ' "$2" "$3" 2>/dev/null; do',
        '    for s in "${servers[@]}"; do',
        '      kill -0 "$s" 2>/dev/null || { echo "topoplan: a server exited before $1 answered" >&2; stop 1; }',
        "    done",
        '    if [ "$SECONDS" -ge "$topoplan_deadline" ]; then',
        f'      echo "topoplan: no answer from $1 on $2:$3 within {timeout} s" >&2',
        "      stop 1",
        "    fi",
        f"    sleep {POLL_S}",
        "  done",
        "}",
    ])


def _start(p: Process) -> list[str]:
    return [_describe(p), _join([*env_words(p.env_dict()), *p.argv]) + " &", 'servers+=("$!")']


def _node_lines(launch: DisaggLaunch, node: int) -> list[str]:
    out = [line for p in launch.workers if p.node == node for line in _start(p)]
    if node == 0:
        out += [f"topoplan_wait {p.name} {_word(p.address)} {p.port}" for p in launch.workers]
        router = launch.router
        probe = "127.0.0.1" if launch.options.host in (ALL_INTERFACES, "::") else launch.options.host
        out += [*_start(router), f"topoplan_wait router {_word(probe)} {router.port}",
                f'echo "topoplan: {launch.engine.name} (disaggregated) serves "{_word(launch.url)}']
    return out


def body_lines(launch: DisaggLaunch) -> list[str]:
    """Everything after the header: checks, the stop and wait functions, this node's servers, the final wait."""
    programs = [w for p in launch.processes for w in argv_programs(p.argv)]
    out = ["set -m  # every server gets its own process group, so one signal reaches all it started",
           *require_lines(programs, [launch.options.checkpoint]), *ifname_guard(_words(launch), launch.options.ifname),
           *_address_lines(launch), _stop(), _health()]
    if launch.nodes == 1:
        out += _node_lines(launch, 0)
    else:
        out += [f': "${{{NODE_VAR}:?set {NODE_VAR} to the node index of this host, 0 for node 0}}"',
                f'case "${NODE_VAR}" in']
        for node in range(launch.nodes):
            out += [f"  {node})", *(f"    {line}" for line in _node_lines(launch, node)), "    ;;"]
        out += [f'  *) echo "topoplan: no node ${NODE_VAR} in this launch" >&2; exit 2 ;;', "esac"]
    return [*out, "wait -n  # the first server to exit ends the deployment", "status=$?",
            'echo "topoplan: a server exited (status $status); stopping the others" >&2', 'stop "$status"']


def render_disagg_shell(launch: DisaggLaunch) -> str:
    return "\n".join([SHEBANG, *_header(launch), *body_lines(launch)]) + "\n"


def _slurm_step(launch: DisaggLaunch, cluster_options: bool) -> list[str]:
    """From `set -euo pipefail` on: read the allocation (node 0's and every node's address), start one task per node
    running the shell script's body for its node, wait for the router's health endpoint."""
    nodes = launch.nodes
    script = "\n".join([f'{NODE_VAR}="$SLURM_NODEID"', *body_lines(launch)])
    addresses = [f'export {NODE_ADDR_VAR.format(node=n)}=$(scontrol show node -o "${{topoplan_hosts[{n}]}}" | '
                 "sed -n 's/.*[[:space:]]NodeAddr=\\([^[:space:]]*\\).*/\\1/p')" for n in range(nodes)] \
        if nodes > 1 else []
    nodelist = [f"--nodelist={','.join(launch.hosts)}"] if all(launch.hosts) else []  # type: ignore[arg-type]
    srun = ["srun", *(launch.launcher.slurm_args() if cluster_options else []), f"--nodes={nodes}",
            "--ntasks-per-node=1", "--cpu-bind=none", "--export=ALL", *nodelist, "bash", "-c", script,
            "topoplan-disagg"]
    return ["set -euo pipefail", *allocation_lines(nodes), *addresses,
            *ifname_guard(_words(launch), launch.options.ifname),
            "# the servers bind their own workers: one task per node runs that node's servers (node 0: and the router)",
            shlex.join(srun) + " &", "server=$!",
            "trap 'kill -TERM \"$server\" 2>/dev/null' INT TERM  # srun passes the signal to every task",
            *wait_lines(f"{launch.engine.name} router", launch.options.host, launch.options.port, launch.url)]


def render_disagg_sbatch(launch: DisaggLaunch) -> str:
    """One task per node runs the shell script's body for its node; node addresses come from the allocation."""
    header = [*launch.launcher.slurm_args(job_name=f"topoplan-{launch.engine.name}-disagg"),
              f"--nodes={launch.nodes}", "--ntasks-per-node=1", f"--gpus-per-node={launch.gpus_per_node}",
              *WHOLE_NODES]
    if all(launch.hosts):
        header.append(f"--nodelist={','.join(launch.hosts)}")  # type: ignore[arg-type]
    return "\n".join(["#!/bin/bash", *(f"#SBATCH {shlex.quote(h)}" for h in header), *_header(launch),
                      *_slurm_step(launch, cluster_options=False)]) + "\n"


def render_disagg_srun(launch: DisaggLaunch) -> str:
    """The batch script's step, to run inside an allocation of whole nodes (salloc)."""
    hint = f"# run inside an allocation of whole nodes: {salloc_hint(launch.nodes)} bash SCRIPT"
    return "\n".join([SHEBANG, *_header(launch), hint, *_slurm_step(launch, cluster_options=True)]) + "\n"


def disagg_dict(launch: DisaggLaunch) -> dict:
    """The JSON contract: the engine, the router's URL, every process (its role, node, GPUs, KV NICs, port, argv,
    environment and chosen options with their reasons) and the plan's notes."""
    def process(p: Process) -> dict:
        return {"name": p.name, "role": p.role, "node": p.node, "gpus": list(p.gpus), "kv_nics": list(p.nics),
                "port": p.port, "address": p.address, "argv": list(p.argv), "env": p.env_dict(),
                "reasons": {v.name: v.reason for v in p.env},
                "options": [{"words": list(o.words), "reason": o.reason} for o in p.options]}
    prefill, decode = launch.plan.ratio
    return {"engine": launch.engine.name, "url": launch.url, "disagg": {"prefill": prefill, "decode": decode},
            "nodes": launch.nodes, "router": launch.router_label,
            "processes": [process(p) for p in launch.processes], "notes": list(launch.notes)}


def render_disagg(launch: DisaggLaunch, fmt: str) -> str:
    if fmt not in DISAGG_FORMATS:
        raise TopoplanError(f"--format {fmt} with --disagg: expected one of {', '.join(DISAGG_FORMATS)}")
    if fmt == "json":
        return json.dumps(disagg_dict(launch), indent=2) + "\n"
    if fmt == "sbatch":
        return render_disagg_sbatch(launch)
    if fmt == "srun":
        return render_disagg_srun(launch)
    if fmt == "lws":
        from topoplan.launch.engines.disagg_lws import render_disagg_lws

        return render_disagg_lws(launch, body_lines)
    return render_disagg_shell(launch)
