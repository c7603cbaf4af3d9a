"""`launch --engine ... --format lws`: the LeaderWorkerSet validates against LWS v0.10.0's CRD schema and the core
Container schema (tests/data/lws, with their sources), says what it asks of the cluster, and its commands, run here
as a pod would run them (Kubernetes' `$(VAR)` expansion, LWS's variables), start each node's planned line.
Also: the YAML writer's output reads back as the same data (PyYAML), for any strings."""

from __future__ import annotations

import copy
import gzip
import json
import os
import re
import subprocess

import jsonschema
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from launch_support import ROOT
from typer.testing import CliRunner

from topoplan.cli import app
from topoplan.launch.yaml_text import dump

DATA = ROOT / "tests" / "data" / "lws"
DGX = ROOT / "fixtures" / "topo" / "00_dgx-a100-8gpu-nv12-10nic-gpu-rows-only.txt"
MI300 = ROOT / "fixtures" / "amd" / "rocm-smi-mi300-8gpu-xgmi-2numa.txt"
IMAGE = "registry.example/vllm-openai:v0.32.0"


def crd_schema() -> dict:
    crd = yaml.safe_load(gzip.open(DATA / "leaderworkerset.x-k8s.io_leaderworkersets.yaml.gz"))
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return version["schema"]["openAPIV3Schema"]


def strict(schema: dict) -> dict:
    """The schema refusing fields it does not name (the API server would prune them silently): every object
    schema with properties and no rule for other keys gets additionalProperties: false."""
    schema = copy.deepcopy(schema)

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if "properties" in node and "additionalProperties" not in node and \
                    not node.get("x-kubernetes-preserve-unknown-fields"):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


CRD = jsonschema.Draft7Validator(crd_schema())
CRD_STRICT = jsonschema.Draft7Validator(strict(crd_schema()))
CONTAINER = jsonschema.Draft7Validator(json.loads((DATA / "core-v1-container-subset.json").read_text()))


def launch(*args: str):
    return CliRunner().invoke(app, ["launch", "--format", "lws", *args])


def manifest(*args: str) -> tuple[dict, str]:
    result = launch(*args)
    assert result.exit_code == 0, result.output
    return yaml.safe_load(result.stdout), result.stdout


def pods(doc: dict) -> list[dict]:
    template = doc["spec"]["leaderWorkerTemplate"]
    return [template[k]["spec"] for k in ("leaderTemplate", "workerTemplate") if k in template]


def validate(doc: dict) -> None:
    CRD.validate(doc)
    CRD_STRICT.validate(doc)
    for pod in pods(doc):
        for container in pod["containers"]:
            CONTAINER.validate(container)


TWO_NODES = ("--engine", "vllm", "--topo", str(DGX), "--layout", "tp=8,pp=2", "--nodes", "2", "--checkpoint",
             "/models/llama-70b", "--image", IMAGE)


def test_two_node_vllm_manifest_validates_and_says_what_it_needs():
    doc, text = manifest(*TWO_NODES, "--pod-memory", "900Gi")
    validate(doc)
    assert (doc["apiVersion"], doc["kind"], doc["metadata"]["name"]) == ("leaderworkerset.x-k8s.io/v1",
                                                                        "LeaderWorkerSet", "topoplan-vllm")
    template = doc["spec"]["leaderWorkerTemplate"]
    assert template["size"] == 2 and template["restartPolicy"] == "RecreateGroupOnPodRestart"
    leader, worker = (pod["containers"][0] for pod in pods(doc))
    assert leader["command"][:4] == ["python3", "-m", "vllm.entrypoints.cli.main", "serve"]
    assert "numactl" not in leader["command"] and "numactl" not in worker["command"]  # host CPU numbers left out
    assert "--numa-bind-cpus" not in leader["command"] and "--numa-bind-nodes" in leader["command"]
    for c in (leader, worker):
        assert c["command"][c["command"].index("--master-addr") + 1] == "$(LWS_LEADER_ADDRESS)"
        # SYS_NICE: vLLM's --numa-bind sets memory policies, which the default seccomp profile allows only with it
        assert c["image"] == IMAGE and c["securityContext"] == {"capabilities": {"add": ["IPC_LOCK", "SYS_NICE"]}}
        assert c["volumeMounts"] == [{"name": "dshm", "mountPath": "/dev/shm"},
                                     {"name": "model", "mountPath": "/models/llama-70b", "readOnly": True}]
        limits = {"nvidia.com/gpu": 8, "rdma/rdma_shared_device_a": 1, "cpu": 128, "memory": "900Gi"}
        assert c["resources"] == {"limits": limits, "requests": limits}  # Guaranteed: requests = limits
        env = {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}
        assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7" and env["NCCL_IB_HCA"].startswith("=mlx5_0")
        # several pods: NCCL and gloo over the pod network, and vLLM announces the pod's own IP
        assert (env["NCCL_SOCKET_IFNAME"], env["GLOO_SOCKET_IFNAME"]) == ("eth0", "eth0")
        assert env["VLLM_HOST_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert worker["command"][worker["command"].index("--node-rank") + 1] == "1" and "--headless" in worker["command"]
    assert leader["command"][leader["command"].index("--host") + 1] == "0.0.0.0"
    assert leader["readinessProbe"]["httpGet"] == {"path": "/health", "port": 8000}
    assert "readinessProbe" not in worker and leader["ports"] == [{"name": "http", "containerPort": 8000}]
    for pod in pods(doc):
        assert pod["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory"}},
                                  {"name": "model", "hostPath": {"path": "/models/llama-70b", "type": "Directory"}}]
    # the policy that makes the CPU request a binding: GPUs of both sockets, so not single-numa-node
    assert "--cpu-manager-policy=static and --topology-manager-policy=restricted" in text


def test_without_pod_memory_nothing_claims_to_pin_cpus():
    doc, text = manifest(*TWO_NODES)
    validate(doc)
    for pod in pods(doc):
        assert set(pod["containers"][0]["resources"]["limits"]) == {"nvidia.com/gpu", "rdma/rdma_shared_device_a"}
    assert "the kubelet pins no CPUs (give --pod-memory to pin them)" in text and "cpu-manager-policy" not in text


def test_gpus_of_one_numa_node_need_single_numa_node():
    doc, text = manifest("--engine", "sglang", "--topo", str(DGX), "--layout", "tp=2", "--checkpoint", "/m",
                         "--image", IMAGE, "--pod-memory", "200Gi")
    validate(doc)
    template = doc["spec"]["leaderWorkerTemplate"]
    assert template["size"] == 1 and "leaderTemplate" not in template  # a group of one: its worker template
    (container,) = template["workerTemplate"]["spec"]["containers"]
    assert container["command"][:3] == ["python3", "-m", "sglang.launch_server"]
    assert container["resources"]["limits"]["cpu"] == 32  # GPU0 and GPU1's planned CPUs
    assert "--topology-manager-policy=single-numa-node" in text


def test_amd_pods_ask_for_amd_gpus():
    doc, _ = manifest("--engine", "vllm", "--topo", str(MI300), "--layout", "tp=8", "--checkpoint", "/m",
                      "--image", IMAGE)
    validate(doc)
    (pod,) = pods(doc)
    assert pod["containers"][0]["resources"]["limits"] == {"amd.com/gpu": 8}


def kube_expand(word: str, env: dict[str, str]) -> str:
    """Kubernetes' expansion of command and env: `$$` is `$`, `$(NAME)` the variable (kept when undefined)."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), word)


def test_three_node_workers_pick_their_line_by_worker_index(tmp_path):
    engine = tmp_path / "engine"
    engine.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@" > "$OUT/argv.$LWS_WORKER_INDEX"\n'
                      'printf "%s" "$CUDA_VISIBLE_DEVICES" > "$OUT/cvd.$LWS_WORKER_INDEX"\n')
    engine.chmod(0o755)
    doc, _ = manifest("--engine", "vllm", "--topo", str(DGX), "--layout", "tp=8,pp=3", "--nodes", "3",
                      "--checkpoint", "/m", "--engine-python", str(engine), "--image", IMAGE, "--",
                      "--served-model-name", "it's $(HOME) $$")
    validate(doc)
    worker = doc["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]
    assert worker["command"][:2] == ["bash", "-c"]
    for index in (1, 2):  # what each worker pod runs: LWS's variables, the container env, then the command
        lws = {"LWS_LEADER_ADDRESS": "topoplan-vllm-0.topoplan-vllm.default", "LWS_WORKER_INDEX": str(index)}
        env = dict(os.environ, OUT=str(tmp_path), **lws)
        env.update({e["name"]: kube_expand(e["value"], env) for e in worker["env"] if "value" in e})
        subprocess.run([kube_expand(w, env) for w in worker["command"]], env=env, check=True, timeout=60)
        argv = (tmp_path / f"argv.{index}").read_text().splitlines()
        assert argv[argv.index("--node-rank") + 1] == str(index) and "--headless" in argv
        assert argv[argv.index("--master-addr") + 1] == lws["LWS_LEADER_ADDRESS"]
        assert argv[-2:] == ["--served-model-name", "it's $(HOME) $$"]  # the user's words stay literal
        assert (tmp_path / f"cvd.{index}").read_text() == "0,1,2,3,4,5,6,7"
    leader = doc["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]
    assert kube_expand(leader["command"][-1], {"HOME": "/root"}) == "it's $(HOME) $$"


def test_the_schemas_catch_what_they_should():
    doc, _ = manifest(*TWO_NODES)
    bad = copy.deepcopy(doc)
    bad["spec"]["leaderWorkerTemplate"]["size"] = "2"
    with pytest.raises(jsonschema.ValidationError):
        CRD.validate(bad)
    typo = copy.deepcopy(doc)
    typo["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["readinesProbe"] = {}
    CRD.validate(typo)  # the published schema lets an unknown field through (the API server prunes it) ...
    with pytest.raises(jsonschema.ValidationError):
        CRD_STRICT.validate(typo)  # ... the strict reading refuses it
    with pytest.raises(jsonschema.ValidationError):
        CONTAINER.validate(typo["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0])


@pytest.mark.parametrize(("args", "message"), [
    (TWO_NODES[:-2], "--format lws needs --image"),
    ((*TWO_NODES, "--job-name", "Llama 70B"), "--job-name 'Llama 70B': a LeaderWorkerSet's name is a DNS label"),
    ((*TWO_NODES, "--pod-memory", "lots"), "--pod-memory 'lots': expected a Kubernetes memory quantity"),
    (("--engine", "trtllm", "--topo", str(DGX), "--layout", "tp=8,pp=2", "--nodes", "2", "--hosts", "a,b",
      "--ifname", "ib0", "--checkpoint", "/m", "--image", IMAGE), "--format lws with TensorRT-LLM over several nodes"),
    (("--engine", "vllm", "--device", "cpu", "--layout", "tp=2", "--checkpoint", "/m", "--image", IMAGE),
     "--format lws with --device cpu"),
])
def test_bad_requests_are_refused_in_one_line(args, message):
    result = launch(*args)
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.startswith(f"topoplan: error: {message}") and result.stderr.count("\n") == 1


def test_output_file_is_not_executable(tmp_path):
    out = tmp_path / "lws.yaml"
    result = launch(*TWO_NODES, "-o", str(out))
    assert result.exit_code == 0, result.output
    assert not out.stat().st_mode & 0o111 and yaml.safe_load(out.read_text())["kind"] == "LeaderWorkerSet"


KEYS = st.text(max_size=12)
SCALARS = st.one_of(st.text(max_size=40), st.integers(-10**18, 10**18), st.booleans())
DOCS = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                     st.dictionaries(KEYS, inner, max_size=4)), max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(KEYS, DOCS, max_size=5), st.lists(st.text(max_size=30), max_size=3))
def test_yaml_writer_reads_back_as_the_same_data(document, header):
    text = dump(document, header)
    assert yaml.safe_load(text) == (document or None)  # an empty mapping writes nothing but comments
    assert all(" " <= ch <= "~" for ch in text.replace("\n", ""))  # printable ASCII only


def test_yaml_writer_quotes_what_yaml_would_read_as_another_type():
    text = dump({"yes": "no", "on": "1e3", "a": ["null", "~", "010", "- x", "k: v", "#c", "true"]})
    assert yaml.safe_load(text) == {"yes": "no", "on": "1e3", "a": ["null", "~", "010", "- x", "k: v", "#c", "true"]}
    assert text.splitlines()[0] == '"yes": "no"'

