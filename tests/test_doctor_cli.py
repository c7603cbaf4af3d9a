"""`topoplan doctor` from the command line: the live run on this machine, replays of saved recordings, exit
statuses by the worst finding, damaged recordings refused in one line, `--for LAYOUT`, and `launch --preflight`
stopping a layout whose NICs are down in a recording."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
FIXTURES = ROOT / "fixtures" / "doctor"
TOPO = ROOT / "fixtures" / "topo" / "17_h100-nvl-8gpu-nv12-pairs-2nic.txt"  # the node the recordings describe


def doctor(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "topoplan", "doctor", *args], cwd=ROOT, capture_output=True,
                          text=True, env=env, check=False)


def fixture(name: str) -> str:
    return str(FIXTURES / f"{name}.json")


def findings(result: subprocess.CompletedProcess) -> list[dict]:
    return json.loads(result.stdout)["findings"]


def test_live_run_reports_this_machines_shm_and_cpuset():
    result = doctor("--json")
    assert result.returncode in (0, 3, 4), result.stderr
    data = json.loads(result.stdout)
    assert data["source"] == "this machine" and data["exit_code"] == result.returncode
    by_check = {f["check"]: f for f in data["findings"]}
    shm = os.statvfs("/dev/shm")
    total = shm.f_blocks * shm.f_frsize
    size = f"{total / 2**30:.1f} GiB" if total >= 2**30 else f"{total / 2**20:.0f} MiB"
    assert by_check["shm"]["evidence"].startswith(f"statvfs(/dev/shm): {size} total, ")
    allowed = next(line.split(":", 1)[1].strip() for line in Path("/proc/self/status").read_text().splitlines()
                   if line.startswith("Cpus_allowed_list"))
    assert f"Cpus_allowed_list = {allowed};" in by_check["cpuset"]["evidence"]


def test_table_names_sources_and_exit_status():
    result = doctor("--file", fixture("shm-docker-64m"), env={**os.environ, "COLUMNS": "250"})
    assert result.returncode == 4
    assert "statvfs(/dev/shm): 64 MiB total, 64 MiB free" in result.stdout
    assert "fix: Docker: --ipc=host or --shm-size=1g" in result.stdout
    assert "worst: blocks; exit status 4" in result.stdout


@pytest.mark.parametrize(("name", "code"), [("healthy-h100-nvl-8gpu", 0), ("net-down", 0), ("p2p-missing", 0),
                                            ("pcie-gpu-x8", 3), ("nvlink-down", 3), ("acs-redirect", 4),
                                            ("shm-docker-64m", 4)])
def test_exit_status_by_worst_severity(name: str, code: int):
    result = doctor("--file", fixture(name), "--json")
    assert result.returncode == code, result.stderr
    assert json.loads(result.stdout)["exit_code"] == code


def test_save_then_replay_gives_the_same_findings(tmp_path: Path):
    saved = tmp_path / "machine.json"
    live = doctor("--json", "--save", str(saved))
    replay = doctor("--json", "--file", str(saved))
    assert replay.returncode == live.returncode
    assert findings(replay) == findings(live)
    assert json.loads(saved.read_text())["built_by_hand"] is False
    assert [p.name for p in tmp_path.iterdir()] == ["machine.json"]  # no temporary file left


@pytest.mark.parametrize(("edit", "field"), [
    (lambda r: r["pci"]["0000:18:00.0"].update(max_link_width=16), "pci.0000:18:00.0"),
    (lambda r: r["shm"].update(free_bytes="lots"), "shm"),
    (lambda r: r["cpus"].pop("online"), "cpus.online"),
    (lambda r: r["nvml"]["gpus"][3].update(persistence_mode=[1]), "nvml"),
    (lambda r: r.update(schema_version=2), "schema_version"),
    (lambda r: r["infiniband"]["mlx5_0"]["ports"]["1"].update(state={"x": 1}), "infiniband.mlx5_0.ports.1.state"),
])
def test_damaged_recording_is_one_line_naming_file_and_field(tmp_path: Path, edit, field: str):
    recording = json.loads(Path(fixture("healthy-h100-nvl-8gpu")).read_text())
    edit(recording)
    path = tmp_path / "damaged.json"
    path.write_text(json.dumps(recording))
    result = doctor("--file", str(path))
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"topoplan: error: {path}: damaged doctor recording: {field}")


@pytest.mark.parametrize(("content", "words"), [
    ("{not json", "not valid JSON"),
    ('{"format": "topoplan-nvml-recording"}', 'field format: expected "topoplan-doctor-recording"'),
    ("[1, 2]", 'field format: expected "topoplan-doctor-recording"'),
])
def test_not_a_recording_is_one_line(tmp_path: Path, content: str, words: str):
    path = tmp_path / "bad.json"
    path.write_text(content)
    result = doctor("--file", str(path))
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1 and words in result.stderr
    assert str(path) in result.stderr


def test_option_mistakes_are_user_errors(tmp_path: Path):
    assert "--save records this machine" in doctor("--file", fixture("net-down"), "--save", str(tmp_path / "x")).stderr
    assert "pass --for" in doctor("--preflight").stderr
    for option in (["--topo", str(TOPO)], ["--nodes", "2"], ["--engine", "vllm"]):
        assert doctor(*option).stderr == ("topoplan: error: --topo, --gpu, --nodes and --engine describe a layout: "
                                          "pass --for tp=N,pp=N,dp=N too\n")
    bad = doctor("--file", fixture("net-down"), "--for", "tp=2", "--topo", str(TOPO), "--engine", "ollama")
    assert bad.returncode == 2 and "--engine 'ollama': expected one of topoplan, vllm, trtllm, sglang" in bad.stderr
    assert not list(tmp_path.iterdir())


def for_layout(name: str, layout: str, nodes: int, *extra: str) -> subprocess.CompletedProcess:
    return doctor("--file", fixture(name), "--for", layout, "--nodes", str(nodes), "--topo", str(TOPO), *extra)


def test_for_layout_on_a_healthy_node():
    result = for_layout("healthy-h100-nvl-8gpu", "tp=2,dp=8", 2, "--json")
    assert result.returncode == 0, result.stderr
    got = {(f["check"], f["subject"]): f["severity"] for f in findings(result)}
    assert got == {("layout-nic", "mlx5_0 (nearest GPU0, GPU1, GPU2, GPU3, GPU4, GPU5, GPU6, GPU7)"): "ok",
                   ("layout-nic", "mlx5_1 (nearest GPU0, GPU1, GPU2, GPU3, GPU4, GPU5, GPU6, GPU7)"): "ok",
                   # tp=2 is placed on the NVLink pairs of fixture 17
                   **{("layout-p2p", f"TP pair GPU{a}-GPU{a + 1}"): "ok" for a in (0, 2, 4, 6)},
                   ("shm", "/dev/shm"): "ok", ("layout-cpus", "bound CPUs"): "ok"}


def test_for_layout_finds_what_the_layout_needs():
    nic = for_layout("ib-ports-down", "tp=2,dp=8", 2, "--json")
    assert nic.returncode == 4
    assert {f["subject"].split()[0] for f in findings(nic) if f["severity"] == "blocks"} == {"mlx5_0", "mlx5_1"}
    assert for_layout("ib-ports-down", "tp=2,dp=4", 1, "--json").returncode == 0  # one node: no NIC needed
    p2p = for_layout("p2p-missing", "tp=2,dp=4", 1, "--json")
    assert p2p.returncode == 3
    assert [(f["subject"], f["severity"]) for f in findings(p2p) if f["severity"] != "ok"] == [
        ("TP pair GPU0-GPU1", "slows")]
    cpus = for_layout("cpuset-narrow", "tp=2,dp=4", 1, "--json")
    blocked = [f for f in findings(cpus) if f["severity"] == "blocks"]
    assert cpus.returncode == 4 and len(blocked) == 8  # every rank binds CPUs outside 0-15
    assert blocked[0]["message"] == ("bound to CPUs 0-15,128-143, of which 128-143 are outside this cpuset: numactl "
                                     "refuses to start it")
    sglang = for_layout("healthy-h100-nvl-8gpu", "tp=2,dp=4", 1, "--engine", "sglang", "--json")
    assert sglang.returncode == 0  # 1008 GiB of /dev/shm


def test_preflight_is_silent_when_fine_and_one_line_when_blocked():
    fine = for_layout("healthy-h100-nvl-8gpu", "tp=2,dp=8", 2, "--preflight")
    assert (fine.returncode, fine.stdout, fine.stderr) == (0, "", "")
    blocked = for_layout("ib-ports-down", "tp=2,dp=8", 2, "--preflight")
    assert blocked.returncode == 4 and blocked.stdout == ""
    assert blocked.stderr.splitlines() == [
        "topoplan: preflight: mlx5_0 (nearest GPU0, GPU1, GPU2, GPU3, GPU4, GPU5, GPU6, GPU7): down, and ranks on "
        "GPU0, GPU1, GPU2, GPU3, GPU4, GPU5, GPU6, GPU7 have no other nearest NIC up for the traffic between nodes "
        "(/sys/class/infiniband/mlx5_0/ports/1/state = 1: DOWN); fix: bring mlx5_0 up (`ibstat mlx5_0`, `ip link`), "
        "or leave it out: NCCL_IB_HCA=^mlx5_0"]
    slow = for_layout("p2p-missing", "tp=2,dp=4", 1, "--preflight")
    assert slow.returncode == 0 and slow.stderr.startswith("topoplan: warning: doctor: TP pair GPU0-GPU1: no peer")


def launch_script(tmp_path: Path, *extra: str) -> Path:
    script = tmp_path / "launch.sh"
    result = subprocess.run([sys.executable, "-m", "topoplan", "launch", "--topo", str(TOPO), "--layout", "tp=2,dp=8",
                             "--nodes", "2", "--hosts", "a,b", "--preflight", "--format", "shell", "-o", str(script),
                             *extra, "--", "touch", str(tmp_path / "started")], cwd=ROOT, capture_output=True,
                            text=True, check=False)
    assert result.returncode == 0, result.stderr
    return script


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash to run the emitted script")
def test_launch_preflight_stops_a_layout_whose_nic_is_down(tmp_path: Path):
    script = launch_script(tmp_path)
    text = script.read_text()
    lines = text.splitlines()
    assert lines[0] == "#!/usr/bin/env bash" and lines[1].startswith("# topoplan launch:")
    assert lines[2] == (f"python3 -m topoplan doctor --preflight --for=tp=2,pp=1,dp=8 --nodes 2 --engine=topoplan "
                        f"--topo={TOPO.resolve()} ${{TOPOPLAN_DOCTOR_FILE:+--file=\"$TOPOPLAN_DOCTOR_FILE\"}} "
                        "|| exit $?  # stop here if this host cannot run the layout")
    down = tmp_path / "dir with space" / "down.json"
    down.parent.mkdir()
    shutil.copy(fixture("ib-ports-down"), down)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOPOPLAN_NODE": "0", "TOPOPLAN_DOCTOR_FILE": str(down),
           "MASTER_ADDR": "127.0.0.1"}
    result = subprocess.run(["bash", str(script)], cwd=tmp_path, capture_output=True, text=True, env=env, check=False)
    assert result.returncode == 4
    assert result.stderr.startswith("topoplan: preflight: mlx5_0 (nearest GPU0")
    assert len(result.stderr.splitlines()) == 1
    assert not (tmp_path / "started").exists()  # no rank was started


@pytest.mark.parametrize(("args", "error"), [
    (["--topo", str(TOPO), "--format", "json"], "--preflight adds a line to a shell script; --format json is not one"),
    (["--topo", "-", "--format", "shell"], "--preflight reruns the placement on the launch host and cannot re-read "
                                           "stdin: pass --topo FILE"),
    (["--device", "cpu", "--format", "shell"], "--preflight checks what a GPU layout needs (its NICs, P2P, CPUs near "
                                               "its GPUs); --device cpu has no GPU: drop one of them"),
])
def test_launch_preflight_refuses_what_it_cannot_check(args: list[str], error: str):
    result = subprocess.run([sys.executable, "-m", "topoplan", "launch", "--layout", "tp=2", "--preflight", *args],
                            cwd=ROOT, capture_output=True, text=True, check=False, input=TOPO.read_text())
    assert (result.returncode, result.stderr, result.stdout) == (2, f"topoplan: error: {error}\n", "")


@pytest.mark.parametrize(("args", "absent"), [
    ([], ["torch", "networkx", "topoplan.plan.placement"]),  # no graph model, no planner
    (["--for", "tp=2,dp=8", "--nodes", "2", "--topo", str(TOPO), "--file", fixture("healthy-h100-nvl-8gpu")],
     ["torch"]),
])
def test_doctor_starts_without_torch(args: list[str], absent: list[str]):
    code = ("import sys\nfrom topoplan.cli import main\nsys.argv = ['topoplan', 'doctor', '--json', *sys.argv[1:]]\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            f"print('loaded:', [m for m in {absent!r} if m in sys.modules])")
    result = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True,
                            check=False)
    assert result.stdout.splitlines()[-1] == "loaded: []", result.stderr
