"""The serve script `launch --engine ... --format shell` writes: run in the foreground, it ends every process the
engine started on Ctrl-C (INT) or TERM, and passes on the server's exit status. The engine here is a stand-in
"Python" that starts workers and grandchildren as an engine does (tests/test_vllm_serve.py runs real vLLM)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.launch_support import MARK, ROOT, marked_processes

FAKE_ENGINE = """#!/usr/bin/env bash
# stands in for `python -m vllm...`: two workers, one with a child of its own, then the server waits
echo "engine argv: $*"
sleep 300 &
bash -c 'sleep 300 & wait' &
if [ -n "${FAKE_EXIT:-}" ]; then sleep 1; exit "$FAKE_EXIT"; fi
wait
"""


def serve_script(tmp_path: Path, *extra: str) -> Path:
    fake = tmp_path / "fake-python"
    fake.write_text(FAKE_ENGINE)
    fake.chmod(0o755)
    script = tmp_path / "serve.sh"
    (tmp_path / "ckpt").mkdir(exist_ok=True)  # the script checks the checkpoint folder before it starts the engine
    subprocess.run([sys.executable, "-m", "topoplan", "launch", "--engine", "vllm", "--device", "cpu", "--layout",
                    "tp=1", "--checkpoint", str(tmp_path / "ckpt"), "--engine-python", str(fake), *extra,
                    "-o", str(script)], check=True, env=dict(os.environ, PYTHONPATH=str(ROOT), HOME=str(tmp_path)))
    return script


def start(script: Path, mark: str, **env: str) -> subprocess.Popen:
    # SIGINT back to its default first: a test run started as a background job inherits SIGINT ignored, and bash
    # cannot trap a signal ignored on entry (a user's terminal never starts the script that way)
    proc = subprocess.Popen(["bash", str(script)], env=dict(os.environ, **{MARK: mark}, **env),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    while len(marked_processes(mark)) < 5 and time.monotonic() < deadline:  # bash, engine, 2 workers, grandchild
        time.sleep(0.1)
    assert len(marked_processes(mark)) >= 5, "the stand-in engine did not start its workers"
    return proc


def gone(mark: str, timeout_s: float = 20) -> bool:
    deadline = time.monotonic() + timeout_s
    while marked_processes(mark) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not marked_processes(mark)


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_ends_every_process(tmp_path: Path, sig: signal.Signals, code: int) -> None:
    mark = uuid.uuid4().hex
    proc = start(serve_script(tmp_path), mark)
    proc.send_signal(sig)
    assert proc.wait(timeout=60) == code
    assert gone(mark), f"left running: {marked_processes(mark)}"
    assert "--host 127.0.0.1 --port 8000" in (proc.stdout.read() if proc.stdout else "")


def test_the_servers_status_is_the_scripts_and_leftovers_are_ended(tmp_path: Path) -> None:
    mark = uuid.uuid4().hex
    proc = start(serve_script(tmp_path, "--host", "0.0.0.0", "--port", "8123"), mark, FAKE_EXIT="3")
    assert proc.wait(timeout=60) == 3
    assert gone(mark), f"the server's workers outlived it: {marked_processes(mark)}"
    assert "--host 0.0.0.0 --port 8123" in (proc.stdout.read() if proc.stdout else "")
