"""`--format shell`: one plain `env ... numactl ... COMMAND &` line per rank, then a wait that keeps failures.

If one rank fails, the others are killed at once rather than left waiting for the failed rank's collectives
until their timeout (300 s in the runner); Ctrl-C or a TERM to the script ends every rank too. The script exits
with the first failing rank's status.

With several nodes the script is the same on every host and runs the block of the node named by
TOPOPLAN_NODE (0-based), so nothing starts on the wrong host by accident.
"""

from __future__ import annotations

import shlex

from topoplan.launch.dispatch import SHEBANG, env_words
from topoplan.launch.requires import argv_programs, require_lines
from topoplan.launch.spec import LaunchSpec, require_master_addr

KILL_ON_SIGNAL = "trap 'kill $(jobs -p) 2>/dev/null; exit 143' INT TERM"
# `wait -n` once per rank started here ($ranks, set with them): `jobs -p` would miss ranks that already exited.
WAIT_ALL = "\n".join([
    "status=0",
    "for ((i = 0; i < ranks; i++)); do",
    "  wait -n && continue",
    '  code=$?; [ "$status" = 0 ] && status=$code',
    "  kill $(jobs -p) 2>/dev/null  # one rank failed: end the others now",
    "done",
    'exit "$status"',
])


def rank_line(spec: LaunchSpec, rank: int) -> str:
    r = spec.ranks[rank]
    return shlex.join([*env_words(r.env_dict()), *spec.rank_argv(r)]) + " &"


def render_shell(spec: LaunchSpec) -> str:
    require_master_addr(spec, "a shell launch")
    programs = [p for r in spec.ranks for p in argv_programs(spec.rank_argv(r))]
    out = [SHEBANG,
           f"# topoplan launch: {spec.layout}, {spec.world} rank(s) on {len(spec.nodes)} node(s)",
           *require_lines(programs), KILL_ON_SIGNAL]
    if len(spec.nodes) == 1:
        out += [rank_line(spec, r) for r in spec.nodes[0].ranks]
        out.append(f"ranks={len(spec.nodes[0].ranks)}")
    else:
        out.append(': "${TOPOPLAN_NODE:?set TOPOPLAN_NODE to the node index of this host, 0 for node 0}"')
        for node in spec.nodes:
            out.append(f"# node {node.index}" + (f": {shlex.quote(node.host)}" if node.host else ""))
            out.append(f'if [ "$TOPOPLAN_NODE" = {node.index} ]; then')
            out += ["  " + rank_line(spec, r) for r in node.ranks]
            out.append(f"  ranks={len(node.ranks)}")
            out.append("fi")
    out.append(WAIT_ALL)
    return "\n".join(out) + "\n"
