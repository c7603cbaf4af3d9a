"""The one check that needs a GPU machine (issue 3, item 6): live NVML inspect, --save, replay, compare, and
NVML timings. Run from the repository root on a machine with an NVIDIA driver:

    python benchmarks/nvml_live_check.py [--out DIR] [--runs N]

Prints, and exits 1 if any comparison fails:
  - the median time of the NVML queries and of the sysfs reads (`record_machine`) over N runs;
  - live topology == replay of its saved recording (in process);
  - `inspect --source nvml --save R --json` == `inspect --file R --json` (the CLI, minus "source");
  - NVML's link codes, CPU lists and NUMA nodes against `nvidia-smi topo -m` on the same machine (printed
    differences are findings about the PCI classification, reported, not failed).
The recording and outputs are left in --out (default: a temporary folder) for the closing note.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from topoplan.topology.nvml_reader import record_machine  # noqa: E402
from topoplan.topology.recording import parse_recording, save_recording, topology_from_recording  # noqa: E402


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "topoplan", "inspect", *args], cwd=ROOT, capture_output=True,
                          text=True, check=False)


def snapshot(topo):
    return topo.gpus, topo.nics, topo.links(), topo.arch, topo.gpu_name, topo.notes


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="nvml-check-"))
    out.mkdir(parents=True, exist_ok=True)
    failures = []

    recordings = [record_machine() for _ in range(args.runs)]
    nvml_ms = statistics.median(r["timings"]["nvml_s"] for r in recordings) * 1000
    sysfs_ms = statistics.median(r["timings"]["sysfs_s"] for r in recordings) * 1000
    first = recordings[0]
    print(f"driver {first['nvml']['driver_version']}, NVML {first['nvml']['nvml_version']}, "
          f"{first['nvml']['device_count']} GPUs, {len(first['sysfs']['nics'])} NICs")
    print(f"timings over {args.runs} runs (median): NVML queries {nvml_ms:.1f} ms, sysfs {sysfs_ms:.1f} ms")

    live = topology_from_recording(first, "NVML")
    saved = out / "recording.json"
    save_recording(first, saved)
    replayed = topology_from_recording(parse_recording(saved.read_text(), str(saved)), str(saved))
    same = snapshot(live) == snapshot(replayed)
    print(f"in-process replay == live: {same}")
    failures += [] if same else ["in-process replay differs from live"]
    if any(snapshot(topology_from_recording(r, "NVML"))[:3] != snapshot(live)[:3] for r in recordings[1:]):
        print("note: repeated live reads did not all give the same graph")

    cli_save = out / "cli-recording.json"
    live_run = cli("--source", "nvml", "--save", str(cli_save), "--json")
    replay_run = cli("--file", str(cli_save), "--json") if live_run.returncode == 0 else live_run
    if live_run.returncode or replay_run.returncode:
        failures.append(f"CLI failed: {live_run.stderr.strip() or replay_run.stderr.strip()}")
    else:
        live_json, replay_json = json.loads(live_run.stdout), json.loads(replay_run.stdout)
        live_json.pop("source"), replay_json.pop("source")
        (out / "live.json").write_text(json.dumps(live_json, indent=1))
        print(f"CLI replay == CLI live: {live_json == replay_json}")
        failures += [] if live_json == replay_json else ["CLI replay differs from CLI live"]
        print("table:\n" + cli("--file", str(cli_save)).stdout)

    smi_run = cli("--source", "smi", "--json")
    if smi_run.returncode:
        print(f"nvidia-smi comparison skipped: {smi_run.stderr.strip()}")
    else:
        smi = json.loads(smi_run.stdout)
        (out / "smi.json").write_text(json.dumps(smi, indent=1))
        nvml_codes = {frozenset((l.a, l.b)): l.code for l in live.links()}
        nic_by_name = {n.name: n.id for n in live.nics}
        smi_nic_names = {n["id"]: n["name"] for n in smi["nics"]}

        def ours(device: str) -> str:  # smi numbers NICs in its own column order: match them by name
            return nic_by_name.get(smi_nic_names.get(device), f"{device}?") if device.startswith("NIC") else device

        diffs = []
        for link in smi["links"]:
            mine = nvml_codes.get(frozenset((ours(link["a"]), ours(link["b"]))))
            if mine != link["code"]:
                diffs.append(f"{link['a']}-{link['b']}: smi {link['code']}, NVML {mine}")
        for gpu, smi_gpu in zip(live.gpus, smi["gpus"]):
            if (list(gpu.cpus or []), gpu.numa_node, gpu.gpu_numa_id) != \
                    (smi_gpu["cpus"] or [], smi_gpu["numa_node"], smi_gpu["gpu_numa_id"]):
                diffs.append(f"{gpu.id}: smi cpus/numa/gpu_numa {smi_gpu['numa_node']}/{smi_gpu['gpu_numa_id']}, "
                             f"NVML {gpu.numa_node}/{gpu.gpu_numa_id} (cpus equal: "
                             f"{list(gpu.cpus or []) == (smi_gpu['cpus'] or [])})")
        print(f"NVML vs nvidia-smi topo -m: {len(diffs)} differences" + "".join(f"\n  {d}" for d in diffs))

    print(f"outputs in {out}")
    for failure in failures:
        print(f"FAIL: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
