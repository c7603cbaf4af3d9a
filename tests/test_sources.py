"""`topoplan inspect` sources: --source auto|nvml|smi|file, --save and replay through the CLI, --gpu, and
the clear line when there is no driver. NVML is the fake module (tests/fake_pynvml.py) at the boundary;
nvidia-smi is a script on PATH."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fake_pynvml import fake_pynvml, install

from topoplan.cli import main
from topoplan.errors import TopoplanError
from topoplan.machine import load_topology

ROOT = Path(__file__).parent.parent
H100 = ROOT / "fixtures" / "nvml" / "hgx-h100-8gpu-nvswitch.json"
PASTE = ROOT / "fixtures" / "topo" / "30_hgx-a100-4gpu-nv4-4nic-rst-indented.txt"
B300 = ROOT / "fixtures" / "topo" / "01_b300-sxm6-8gpu-nv18-9nic-sglang.txt"


@pytest.fixture
def nvml_machine(monkeypatch):
    install(monkeypatch, fake_pynvml(json.loads(H100.read_text())))
    for key in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"):
        monkeypatch.delenv(key, raising=False)


@pytest.fixture
def no_driver(monkeypatch):
    install(monkeypatch, fake_pynvml(json.loads(H100.read_text()), init_error="DRIVER_NOT_LOADED"))


def smi_on_path(monkeypatch, tmp_path: Path, script: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\n" + script)
    (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin")


def run_main(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["topoplan", *args])
    with pytest.raises(SystemExit) as done:
        main()
    out, err = capsys.readouterr()
    return done.value.code, out, err


def test_auto_prefers_nvml(nvml_machine, monkeypatch, tmp_path):
    smi_on_path(monkeypatch, tmp_path, "exit 9\n")  # would fail if it were asked
    topo = load_topology(None, None)
    assert topo.source == "NVML" and len(topo.gpus) == 8 and topo.gpu_name == "h100-sxm"


def test_auto_falls_back_to_nvidia_smi_and_says_so(no_driver, monkeypatch, tmp_path):
    smi_on_path(monkeypatch, tmp_path, f'cat "{PASTE}"\n')
    topo = load_topology(None, None)
    assert topo.source == "nvidia-smi topo -m" and len(topo.gpus) == 4
    assert any(n.startswith("NVML was not available (NVML could not start (Driver Not Loaded)") for n in topo.notes)


def test_no_driver_at_all_is_one_line_exit_2(no_driver, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi either
    code, out, err = run_main(monkeypatch, capsys, "inspect")
    assert (code, out) == (2, "")
    assert err == ("topoplan: error: no topology from this machine: NVML could not start (Driver Not Loaded): no "
                   "NVIDIA driver or GPU here; nvidia-smi is not installed (no NVIDIA driver on this machine); read "
                   "a saved paste instead: nvidia-smi topo -m > topo.txt, then --topo topo.txt\n")


def test_source_nvml_does_not_fall_back(no_driver, monkeypatch, tmp_path):
    smi_on_path(monkeypatch, tmp_path, f'cat "{PASTE}"\n')
    with pytest.raises(TopoplanError, match=r"^NVML could not start \(Driver Not Loaded\)"):
        load_topology(None, None, source="nvml")


def test_save_then_replay_through_the_cli(nvml_machine, monkeypatch, tmp_path, capsys):
    saved = tmp_path / "machine.json"
    code, live_out, err = run_main(monkeypatch, capsys, "inspect", "--source", "nvml", "--save", str(saved), "--json")
    assert (code, err) == (0, "")
    code, replay_out, err = run_main(monkeypatch, capsys, "inspect", "--file", str(saved), "--json")
    assert (code, err) == (0, "")
    live, replay = json.loads(live_out), json.loads(replay_out)
    assert live.pop("source") == "NVML" and replay.pop("source") == str(saved)
    assert replay == live
    assert live["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3" and live["gpus"][3]["cuda_index_pci_bus"] == 3
    assert {l["code"] for l in live["links"] if l["a"].startswith("GPU") and l["b"].startswith("GPU")} == {"NV18"}


def test_recording_from_stdin(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", type("In", (), {"buffer": open(H100, "rb")})())
    code, out, _ = run_main(monkeypatch, capsys, "inspect", "--file", "-", "--json")
    assert code == 0 and json.loads(out)["gpu_name"] == "h100-sxm"


@pytest.mark.parametrize(("args", "message"), [
    (("--source", "file"), "--source file needs --file PATH"),
    (("--source", "nvml", "--file", str(PASTE)), "--file reads a saved file; it does not go with --source nvml"),
    (("--file", str(PASTE), "--save", "x.json"), "--save records what NVML says on this machine; it does not go "
                                                 "with --file"),
    (("--source", "smi", "--save", "x.json"), "--save records NVML's answers; it needs --source nvml or auto"),
    (("--file", str(H100), "--p2p", str(PASTE)), "--p2p goes with `topo -m` text; a recording holds NVML's P2P"),
    (("--gpu", "h10", "--file", str(PASTE)), "unknown GPU 'h10'"),
])
def test_option_mistakes_are_one_line(monkeypatch, capsys, args, message):
    code, out, err = run_main(monkeypatch, capsys, "inspect", *args)
    assert (code, out) == (2, "")
    assert err.startswith("topoplan: error: ") and message in err and err.count("\n") == 1


def test_gpu_option_prices_a_paste(monkeypatch, capsys):
    code, out, _ = run_main(monkeypatch, capsys, "inspect", "--file", str(PASTE), "--gpu", "a100-sxm4-80gb", "--json")
    data = json.loads(out)
    assert (code, data["arch"], data["gpu_name"]) == (0, "sm80", "a100-sxm4-80gb")
    assert data["links"][0]["code"] == "NV4" and data["links"][0]["bandwidth_gbps"] == 80.0
    assert not any("inferred" in n for n in data["notes"])


def test_without_gpu_a_paste_gets_an_inferred_family_and_a_note():
    topo = load_topology(str(B300), None)  # B300 boards print NV18 like H100: the conservative sm90 is chosen
    assert topo.arch == "sm90" and topo.gpu_name is None
    assert any("inferred" in n and "--gpu" in n and "B200/B300" in n for n in topo.notes)
    assert topo.link("GPU0", "GPU1").bandwidth_gbps == pytest.approx(18 * 20.6)
    priced = load_topology(str(B300), None, gpu="b200")
    assert priced.arch == "sm100" and priced.link("GPU0", "GPU1").bandwidth_gbps == pytest.approx(18 * 40.1)


def test_the_cli_fails_cleanly_without_a_driver_in_a_fresh_process(tmp_path):
    """End to end, in a new interpreter: a pynvml whose nvmlInit fails as on a machine with no driver."""
    (tmp_path / "pynvml.py").write_text(
        "class NVMLError(Exception):\n    value = 9\n    def __str__(self):\n        return 'Driver Not Loaded'\n"
        "def nvmlInit():\n    raise NVMLError()\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}", "PATH": str(tmp_path)}
    result = subprocess.run([sys.executable, "-m", "topoplan", "inspect", "--source", "auto"], cwd=ROOT, env=env,
                            capture_output=True, text=True, check=False)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("topoplan: error: no topology from this machine: NVML could not start "
                                    "(Driver Not Loaded)") and result.stderr.count("\n") == 1


@pytest.mark.parametrize("fmt", ["table", "json", "dot", "mermaid"])
@pytest.mark.parametrize("recording", sorted((ROOT / "fixtures" / "nvml").glob("*.json")), ids=lambda p: p.stem)
def test_every_recording_renders_in_every_text_format(monkeypatch, capsys, recording, fmt):
    code, out, err = run_main(monkeypatch, capsys, "inspect", "--file", str(recording), "--format", fmt)
    assert (code, err) == (0, "") and out.strip()
    assert "GPU0" in out
