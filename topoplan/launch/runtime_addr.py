"""The head node's address where only the job knows it: Slurm's allocation, LeaderWorkerSet's leader pod.

Under Slurm and LWS the machines are chosen when the job starts, so node 0's address (the engines' rendezvous
address, and where node 0 serves HTTP) cannot be written into the lines. For those formats the spec's master
address is the placeholder word HEAD; each renderer writes every word holding it as an expansion of the variable
its launcher provides: the sbatch/srun script reads the allocation into TOPOPLAN_HEAD_ADDR
(topoplan.launch.render_slurm), a LeaderWorkerSet pod gets LWS_LEADER_ADDRESS from the LWS controller. The
engine modules stay unaware of it: they write the spec's master address and the serve host as for any host.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import replace

from topoplan.launch.spec import LaunchSpec

HEAD_VAR = "TOPOPLAN_HEAD_ADDR"  # the sbatch/srun scripts' variable (render_slurm.allocation_lines sets it)
HEAD = f"@{HEAD_VAR}@"  # the placeholder: only characters shlex leaves unquoted, never a real host name
LWS_LEADER_VAR = "LWS_LEADER_ADDRESS"  # set by the LWS controller in every container of a group
# A folder the shell and Slurm scripts make when they run and write the engine's option files into
# (EngineLaunch.files, e.g. TensorRT-LLM's --config YAML): a word holding FILES names a file there.
FILES_VAR = "TOPOPLAN_FILES"
FILES = f"@{FILES_VAR}@"
RUNTIME_FORMATS = ("srun", "sbatch", "lws")
ALL_INTERFACES = "0.0.0.0"


def default_serve_host(fmt: str, given: str) -> str:
    """Where node 0 serves HTTP when --host is not given (`given` is the default for the other formats).

    Slurm: the head node's own address, reachable from the rest of the cluster (loopback would serve no one
    but node 0). LWS: every interface of the pod, which in its own network namespace are its pod IP (the
    readiness probe and Services reach it there) and loopback (kubectl port-forward)."""
    if fmt in ("srun", "sbatch"):
        return HEAD
    return ALL_INTERFACES if fmt == "lws" else given


def head_at_run_time(spec: LaunchSpec, fmt: str) -> LaunchSpec:
    """The spec with its master address left to the job (formats in RUNTIME_FORMATS), else unchanged. `--hosts`
    stay on the nodes (Slurm uses them as a --nodelist)."""
    if fmt not in RUNTIME_FORMATS:
        return spec
    ranks = tuple(replace(r, env=tuple(replace(v, value=HEAD) if v.name == "MASTER_ADDR" else v for v in r.env))
                  for r in spec.ranks)
    return replace(spec, master_addr=HEAD, ranks=ranks)


def shell_word(word: str, var: str = HEAD_VAR) -> str:
    """`word` quoted for bash, with each HEAD in it written as "$var" and each FILES as "$TOPOPLAN_FILES" (expanded
    when the line runs)."""
    if HEAD not in word and FILES not in word:
        return shlex.quote(word)
    pieces = re.split(f"({re.escape(HEAD)}|{re.escape(FILES)})", word)
    return "".join(f'"${var}"' if p == HEAD else f'"${FILES_VAR}"' if p == FILES else shlex.quote(p) if p else ""
                   for p in pieces)


def shell_join(words: Sequence[str], var: str = HEAD_VAR) -> str:
    return " ".join(shell_word(w, var) for w in words)


def kube_word(word: str) -> str:
    """`word` for a container's command, args or env value: Kubernetes expands `$(NAME)` there and reads `$$` as
    `$`, so every `$` is doubled (the text stays literal) and HEAD becomes `$(LWS_LEADER_ADDRESS)`."""
    return f"$({LWS_LEADER_VAR})".join(part.replace("$", "$$") for part in word.split(HEAD))
