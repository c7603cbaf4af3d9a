"""The serve script's removal of the shared-memory files its server leaves in /dev/shm (topoplan.launch.engines.
render calls these two shell functions in its stop paths).

Why: vLLM's CPU build keeps the buffers of its shared-memory all-reduce in /dev/shm files named after its
rendezvous (`vllm_dist_<id>-...`, 8 MiB per TP2 server) and does not unlink them when its processes are
TERMed, so every server started and stopped through the script left them behind. Which files are this
server's: those that the processes of its own process group have mapped (/proc/PID/maps), noted just before
the script ends the group; never a file of another server or another user, which no process of this group
maps. Only names under /dev/shm/vllm_ are taken (the engine's own files, not a file some library shares with
other programs). Unlinking a file still mapped is safe: its memory stays until the last mapping goes.
"""

from __future__ import annotations

SHM_PREFIX = "/dev/shm/vllm_"

# note_shm: add to $server_shm the /dev/shm/vllm_* files mapped by processes whose process group is $server (the
# fields after the last ") " of /proc/PID/stat are state, ppid, pgrp: a command name may hold spaces or parens).
# remove_shm: unlink them. Pure bash and /proc: no procps needed in a slim container.
SHM_FUNCTIONS = "\n".join([
    "server_shm=''",
    f"note_shm() {{  # the {SHM_PREFIX}* files the server's process group has mapped (the engine's own)",
    "  local stat fields pgrp pid",
    "  for stat in /proc/[0-9]*/stat; do",
    '    { fields=$(<"$stat"); } 2>/dev/null || continue',
    '    fields=${fields##*) }',
    '    read -r _ _ pgrp _ <<< "$fields"',
    '    [ "$pgrp" = "$server" ] || continue',
    "    pid=${stat#/proc/}",
    '    server_shm+=$\'\\n\'$(grep -oE \'' + SHM_PREFIX + '[^ ]+$\' "/proc/${pid%/stat}/maps" 2>/dev/null)',
    "  done",
    "}",
    "remove_shm() {  # unlink what note_shm found (a name still mapped: the memory goes with the last mapping)",
    "  local file",
    '  while IFS= read -r file; do',
    f'    case "$file" in {SHM_PREFIX}*) rm -f -- "$file" ;; esac',
    '  done <<< "$server_shm"',
    "}",
])
