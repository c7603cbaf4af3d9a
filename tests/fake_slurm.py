"""Stand-ins for Slurm's client commands, to run emitted srun/sbatch scripts on a machine without Slurm.

`scontrol show hostnames` prints the allocation's hosts and `scontrol show node -o NAME` a node line with its
NodeAddr, as Slurm 22.05 prints them; `srun` starts its command once per node of `--nodes=N` here, each with
SLURM_NODEID, SLURM_PROCID and SLURM_LOCALID set as Slurm would (one task per node), passes TERM and INT on to
them and exits with the first failing status. tests/test_launch_slurm.py runs the same scripts under real Slurm.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

SRUN = r"""#!/usr/bin/env bash
# stand-in srun: one task per node of --nodes=N, here
nodes=1
while [ $# -gt 0 ] && [[ $1 == --* ]]; do
  case "$1" in --nodes=*) nodes=${1#--nodes=} ;; esac
  shift
done
pids=()
for ((i = 0; i < nodes; i++)); do
  SLURM_NODEID=$i SLURM_PROCID=$i SLURM_LOCALID=0 "$@" &
  pids+=($!)
done
trap 'kill -TERM "${pids[@]}" 2>/dev/null' TERM INT
status=0
for pid in "${pids[@]}"; do
  wait "$pid" || { s=$?; [ "$status" -ne 0 ] || status=$s; }
done
exit "$status"
"""


def fake_slurm(bin_dir: Path, addrs: dict[str, str]) -> dict[str, str]:
    """Write scontrol and srun stand-ins into `bin_dir` for an allocation of `addrs` (host name -> NodeAddr, in
    Slurm's order); the variables that put them first on PATH and describe the allocation."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    lines = {name: f"NodeName={name} Arch=x86_64 CoresPerSocket=1 NodeAddr={addr} NodeHostName={name} State=IDLE"
             for name, addr in addrs.items()}
    nodes = "\n".join(f"    {shlex.quote(name)}) echo {shlex.quote(line)} ;;" for name, line in lines.items())
    scontrol = (f"#!/usr/bin/env bash\n# stand-in scontrol for the allocation {', '.join(addrs)}\n"
                f'if [ "$1 $2" = "show hostnames" ]; then printf "%s\\n" {shlex.join(addrs)}; exit 0; fi\n'
                f'if [ "$1 $2 $3" = "show node -o" ]; then\n  case "$4" in\n{nodes}\n'
                '    *) echo "Node $4 not found" >&2; exit 1 ;;\n  esac\n  exit 0\nfi\n'
                'echo "stand-in scontrol: unexpected arguments: $*" >&2\nexit 2\n')
    for name, text in (("scontrol", scontrol), ("srun", SRUN)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SLURM_JOB_NODELIST": ",".join(addrs)}
