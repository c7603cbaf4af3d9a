"""Bash lines that wait for a started engine's health endpoint before saying where it serves.

A Slurm job prints its URL only once the engine answers: vLLM, SGLang and trtllm-serve all answer `GET /health`
with 200 when their workers are up, which for a large checkpoint takes minutes. The check needs nothing but bash
(`/dev/tcp`) and coreutils' `timeout`, so it runs on any batch node. The wait is bounded
(TOPOPLAN_HEALTH_TIMEOUT seconds, default HEALTH_TIMEOUT_S): a server that never answers is stopped and the job
fails instead of holding its nodes; a server that exits first passes on its status.
"""

from __future__ import annotations

import shlex

from topoplan.launch.runtime_addr import ALL_INTERFACES, HEAD, shell_join, shell_word

HEALTH_PATH = "/health"
HEALTH_TIMEOUT_S = 3600  # a 405B checkpoint over a shared file system loads for tens of minutes
POLL_S = 2
PROBE_S = 5  # one connection attempt: a host that drops packets must not stall the loop
_WILDCARDS = (ALL_INTERFACES, "::")


def probe_host(host: str) -> str:
    """Where to ask: the serve address, or node 0's address when the server listens on every interface."""
    return HEAD if host in _WILDCARDS else host


def probe_words() -> list[str]:
    """A command that succeeds when HOST PORT (appended) answer GET /health with 200, within PROBE_S seconds."""
    request = f"GET {HEALTH_PATH} HTTP/1.0\\r\\nHost: %s\\r\\n\\r\\n"
    probe = ('exec 3<>"/dev/tcp/$1/$2" && printf ' + shlex.quote(request) + ' "$1" >&3 && read -r status <&3 && '
             '[[ $status == HTTP/*" 200"* ]]')
    return ["timeout", str(PROBE_S), "bash", "-c", probe, "topoplan-health"]


def wait_lines(engine: str, host: str, port: int, url: str) -> list[str]:
    """Lines run after `server=$!` (the backgrounded srun): poll until healthy, then print the URL and wait for
    the server; the script exits with the server's status."""
    timeout = f"${{TOPOPLAN_HEALTH_TIMEOUT:-{HEALTH_TIMEOUT_S}}}"
    health_url = shell_word(url + HEALTH_PATH)
    return [
        f"# wait for GET {HEALTH_PATH} to answer 200 (at most TOPOPLAN_HEALTH_TIMEOUT s, default {HEALTH_TIMEOUT_S}: "
        "a large checkpoint loads for minutes), then print the URL",
        "topoplan_healthy() {",
        "  " + shell_join([*probe_words(), probe_host(host), str(port)]) + " 2>/dev/null",
        "}",
        f"topoplan_deadline=$((SECONDS + {timeout}))",
        "until topoplan_healthy; do",
        '  if ! kill -0 "$server" 2>/dev/null; then',
        '    wait "$server" && status=0 || status=$?',
        f'    echo "topoplan: {engine} exited (status $status) before answering "{health_url} >&2',
        '    exit "$((status ? status : 1))"',
        "  fi",
        '  if [ "$SECONDS" -ge "$topoplan_deadline" ]; then',
        f'    echo "topoplan: no answer from "{health_url}" within {timeout} s; stopping {engine}" >&2',
        '    kill -TERM "$server" 2>/dev/null',
        '    wait "$server" || true',
        "    exit 1",
        "  fi",
        f"  sleep {POLL_S}",
        "done",
        f'echo "topoplan: {engine} serves "{shell_word(url)}',
        'wait "$server"',
    ]
