"""Several nodes: the engine lines name the interface that reaches the other nodes (NCCL_SOCKET_IFNAME,
GLOO_SOCKET_IFNAME) and the node's own address on it (VLLM_HOST_IP), or stop until TOPOPLAN_IFNAME says which;
run here with a stand-in engine (tests/fake_engine.py) on the loopback interface (issue 33, item 4)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from topoplan.cli import app
from topoplan.launch.netif import interface_to

ROOT = Path(__file__).resolve().parents[1]
DGX = str(ROOT / "fixtures" / "topo" / "00_dgx-a100-8gpu-nv12-10nic-gpu-rows-only.txt")
FAKE_ENGINE = ROOT / "tests" / "fake_engine.py"
runner = CliRunner()
needs_ip = pytest.mark.skipif(shutil.which("ip") is None and not os.environ.get("CI"), reason="needs iproute2's ip")


def script(tmp_path: Path, engine: str, *extra: str) -> Path:
    done = runner.invoke(app, ["launch", "--topo", DGX, "--layout", "tp=8,pp=2", "--nodes", "2", "--hosts",
                               "node-a,node-b", "--engine", engine, "--checkpoint", str(tmp_path), "--engine-python",
                               f"{sys.executable}", *extra, "--", "--fake"])
    assert done.exit_code == 0, done.output
    path = tmp_path / "serve.sh"
    path.write_text(done.stdout.replace(f"{sys.executable} -m", f"{sys.executable} {FAKE_ENGINE} -m"))
    return path


def run_node(path: Path, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "TOPOPLAN_NODE": "1", "SLURM_NODEID": "1", "FAKE_ENGINE_OUT": str(tmp_path), **env}
    return subprocess.run(["bash", str(path)], capture_output=True, text=True, timeout=60, env=full)


@needs_ip
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_node_lines_bootstrap_over_the_named_interface(tmp_path: Path, engine: str) -> None:
    done = run_node(script(tmp_path, engine), tmp_path, TOPOPLAN_IFNAME="lo")
    assert done.returncode == 0, done.stderr
    env = json.loads((tmp_path / "node1.json").read_text())["env"]
    assert (env["NCCL_SOCKET_IFNAME"], env["GLOO_SOCKET_IFNAME"]) == ("lo", "lo")
    assert env.get("VLLM_HOST_IP") == ("127.0.0.1" if engine == "vllm" else None)


def test_without_an_interface_the_script_stops_before_the_engine(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TOPOPLAN_IFNAME"}
    done = subprocess.run(["bash", str(script(tmp_path, "vllm"))], capture_output=True, text=True, timeout=60,
                          env={**env, "TOPOPLAN_NODE": "1", "SLURM_NODEID": "1", "FAKE_ENGINE_OUT": str(tmp_path)})
    assert done.returncode != 0 and "set TOPOPLAN_IFNAME to the network interface" in done.stderr
    assert not (tmp_path / "node1.json").exists()


@needs_ip
def test_ifname_sets_the_default_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    done = run_node(script(tmp_path, "vllm", "--ifname", "lo"), tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "node1.json").read_text())["env"]["NCCL_SOCKET_IFNAME"] == "lo"
    bad = runner.invoke(app, ["launch", "--topo", DGX, "--layout", "tp=8", "--engine", "vllm", "--checkpoint", "/m",
                              "--ifname", "eth0; rm -rf /"])
    assert bad.exit_code == 2 and "expected a network interface name" in bad.output


def test_this_machine_finds_the_interface_routing_to_node_0() -> None:
    assert interface_to("127.0.0.1") == "lo"
    assert interface_to("no-such-host.invalid") is None


def test_one_node_needs_no_interface() -> None:
    done = runner.invoke(app, ["launch", "--topo", DGX, "--layout", "tp=8", "--engine", "vllm", "--checkpoint", "/m"])
    assert done.exit_code == 0 and "TOPOPLAN_IFNAME" not in done.stdout and "SOCKET_IFNAME" not in done.stdout


def test_scripts_stop_first_when_what_they_call_is_missing(tmp_path: Path) -> None:
    """Missing numactl: one line naming both ways out, status 127, before any rank starts; --mem-policy none binds
    with taskset instead; an engine script whose checkpoint folder is missing stops with status 2."""
    bash = shutil.which("bash")
    runner_lines = runner.invoke(app, ["launch", "--topo", DGX, "--layout", "tp=2", "--format", "shell", "--",
                                       "touch", str(tmp_path / "started")])
    path = tmp_path / "ranks.sh"
    path.write_text(runner_lines.stdout)
    done = subprocess.run([bash, str(path)], capture_output=True, text=True, timeout=60,
                          env={"PATH": str(tmp_path / "empty")})
    assert done.returncode == 127 and "numactl not found on this host" in done.stderr
    assert "--mem-policy none" in done.stderr and done.stderr.count("\n") == 1
    assert not (tmp_path / "started").exists()
    unbound = runner.invoke(app, ["launch", "--topo", DGX, "--layout", "tp=2", "--format", "shell",
                                  "--mem-policy", "none", "--", "true"]).stdout
    assert "numactl" not in unbound and "taskset -c 48-55,176-183 true" in unbound
    served = runner.invoke(app, ["launch", "--topo", DGX, "--layout", "tp=2", "--engine", "vllm", "--checkpoint",
                                 str(tmp_path / "no-such-model"), "--engine-python", sys.executable]).stdout
    path.write_text(served)
    done = subprocess.run([bash, str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "no-such-model not found on this host" in done.stderr


def _port(root: Path, name: str, layer: str, gids: dict[int, tuple[str, str]]) -> None:
    port = root / name / "ports" / "1"
    (port / "gid_attrs" / "types").mkdir(parents=True)
    (port / "gids").mkdir()
    (port / "link_layer").write_text(layer + "\n")
    for index, (kind, gid) in gids.items():
        (port / "gid_attrs" / "types" / str(index)).write_text(kind + "\n")
        (port / "gids" / str(index)).write_text(gid + "\n")


def test_roce_gets_its_routable_gid_index_and_infiniband_none(tmp_path: Path) -> None:
    from topoplan.launch.nccl_env import roce_gid_index

    link_local = "fe80:0000:0000:0000:0a0b:0cff:fe0d:0e0f"
    ipv4 = "0000:0000:0000:0000:0000:ffff:0a00:0001"  # ::ffff:10.0.0.1
    _port(tmp_path, "mlx5_0", "Ethernet", {0: ("IB/RoCE v1", link_local), 1: ("RoCE v2", link_local),
                                           2: ("IB/RoCE v1", ipv4), 3: ("RoCE v2", ipv4)})
    _port(tmp_path, "mlx5_1", "InfiniBand", {0: ("IB/RoCE v1", link_local)})
    found = roce_gid_index(["mlx5_0"], tmp_path)
    assert found is not None and (found.name, found.value) == ("NCCL_IB_GID_INDEX", "3") and "RoCE v2" in found.reason
    assert roce_gid_index(["mlx5_1"], tmp_path) is None and roce_gid_index(["mlx5_9"], tmp_path) is None
