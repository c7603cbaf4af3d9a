"""MoE serving lines of the review scenarios: SGLang's DP attention over two nodes (the DeepSeek recipe, `--tp 16
--dp 16 --enable-dp-attention`) read by SGLang 0.5.23's parser, and TensorRT-LLM's attention DP through the
`--config` YAML its script writes when it runs (issue 33, item 5)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.test_engine_lines import after_module, sglang_parser, trtllm_args
from topoplan.engines import resolve
from topoplan.launch.command import LaunchRequest, engine_launch_for
from topoplan.launch.engines.scripts import render_engine
from topoplan.layout import Layout

ROOT = Path(__file__).resolve().parents[1]
H200 = str(ROOT / "fixtures" / "topo" / "41_h200-8gpu-nv18-10nic-container-cpuset-empty-affinity.txt")
HGX = str(ROOT / "fixtures" / "nvml" / "hgx-h100-8gpu-nvswitch.json")
FAKE_ENGINE = ROOT / "tests" / "fake_engine.py"


def served(engine: str, layout: str, nodes: int = 1, topo: str = HGX, **kw):
    hosts = ("node-a", "node-b")[:nodes] if nodes > 1 else None
    return engine_launch_for(LaunchRequest(layout=Layout.parse(layout), topo=topo, gpu="h200", model="dsv3",
                                           nodes=nodes, hosts=hosts, engine=resolve(engine),
                                           checkpoint="/models/deepseek-v3", **kw))


def test_sglang_dp_attention_over_two_nodes_parses() -> None:
    launch = served("sglang", "tp=1,dp=16,ep=16", nodes=2)
    parser = sglang_parser()
    for command in launch.nodes:
        args = parser.parse_args(after_module(command.argv, "sglang.launch_server"))
        assert (args.tp_size, args.dp_size, args.ep_size, args.enable_dp_attention) == (16, 16, 16, True)
        assert (args.nnodes, args.node_rank, args.dist_init_addr) == (2, command.node, "node-a:29500")
        assert args.numa_node == [0, 0, 0, 0, 1, 1, 1, 1]  # each GPU's NUMA node, in local-rank order
        env = command.env_dict()
        assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"]  # the interface the script asks for


def test_trtllm_attention_dp_writes_its_yaml_when_the_script_runs(tmp_path: Path) -> None:
    launch = served("trtllm", "tp=1,dp=8,ep=8", engine_python=sys.executable)
    (command,) = launch.nodes
    params = trtllm_args(command.argv)
    assert (params["tensor_parallel_size"], params["moe_expert_parallel_size"]) == (8, 8)
    assert params["config"].endswith("/trtllm-extra-llm-api-options.yaml")
    assert command.env_dict()["TLLM_NUMA_AWARE_WORKER_AFFINITY"] == "1"
    standin = tmp_path / "engine.py"  # records the --config file it was given, as the engine would read it
    standin.write_text("import pathlib, sys\n"
                       "argv = sys.argv\n"
                       "config = pathlib.Path(argv[argv.index('--config') + 1])\n"
                       f"pathlib.Path({str(tmp_path)!r}, 'seen').write_text(str(config) + '\\n' + config.read_text())\n"
                       "sys.exit(3)\n")
    (tmp_path / "ckpt").mkdir()
    script = tmp_path / "serve.sh"
    script.write_text(render_engine(launch, "shell").replace(f"{sys.executable} -m", f"{sys.executable} {standin} -m")
                      .replace("/models/deepseek-v3", str(tmp_path / "ckpt")))
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr  # the stand-in engine's own status
    path, content = (tmp_path / "seen").read_text().split("\n", 1)
    assert content == "enable_attention_dp: true\n"
    assert not Path(path).exists()  # the script removed its option files when it ended


def test_a_container_cpuset_narrower_than_the_gpus_binds_no_worker() -> None:
    """The H200 paste from a container whose cpuset holds one socket's CPUs: GPU4-7 list no CPU. Binding their
    workers to NUMA node 1 would name CPUs the container may not use (numactl fails, the worker dies), so no engine
    binds any worker, and the note says why."""
    for engine, flag in (("vllm", "--numa-bind"), ("sglang", "--numa-node")):
        launch = served(engine, "tp=1,dp=8,ep=8", topo=H200)
        assert flag not in launch.nodes[0].argv
        assert any("lists no CPU of GPU4, GPU5, GPU6, GPU7" in note for note in launch.notes)
    assert "TLLM_NUMA_AWARE_WORKER_AFFINITY" not in served("trtllm", "tp=1,dp=8,ep=8", topo=H200).nodes[0].env_dict()



def test_vllm_runs_moe_replicas_only_with_expert_parallel() -> None:
    """Under vLLM's data parallelism an MoE model's replicas share one expert group (all tp x dp ranks): a dp > 1
    layout without EP is refused at launch and never ranked by `plan --engine vllm`."""
    import pytest

    from topoplan.errors import TopoplanError
    from topoplan.plan.frontend import PlanRequest, plan_for

    pairs = str(ROOT / "fixtures" / "nvml" / "a100-pcie-4gpu-bridged-pairs.json")
    with pytest.raises(TopoplanError, match="share one expert group"):
        engine_launch_for(LaunchRequest(layout=Layout(tp=2, dp=2), topo=pairs, model="mixtral",
                                        engine=resolve("vllm"), checkpoint="/m"))
    ranked = plan_for(PlanRequest(model="mixtral", topo=pairs, engine="vllm")).layouts
    assert ranked and all(r.cost.layout.dp == 1 or r.cost.layout.ep > 1 for r in ranked)


def test_trtllm_is_refused_on_amd_gpus() -> None:
    import pytest

    from topoplan.errors import TopoplanError

    mi300 = str(ROOT / "fixtures" / "amd" / "rocm-smi-mi300-8gpu-xgmi-2numa.txt")
    with pytest.raises(TopoplanError, match="NVIDIA GPUs only; this launch is for amd GPUs"):
        engine_launch_for(LaunchRequest(layout=Layout(tp=8), topo=mi300, gpu="mi300x", engine=resolve("trtllm"),
                                        checkpoint="/m"))
