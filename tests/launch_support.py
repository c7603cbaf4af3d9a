"""Shared helpers for the launch tests: topologies from the fixtures' expected JSON, simple placements."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from topoplan.cpuset import CpuFacts
from topoplan.launch.launcher_options import LauncherOptions
from topoplan.layout import Layout, RankPlacement
from topoplan.plan.placement import expand
from topoplan.topology.model import Gpu, Nic, Topology, build_topology

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures" / "topo"
FACTS = CpuFacts.read_sysfs()
EXPECTED = sorted((FIXTURES / "expected").glob("*.json"))
DGX_A100 = FIXTURES / "expected" / "00_dgx-a100-8gpu-nv12-10nic-gpu-rows-only.json"
# The emitted mpirun lines must start as they are: as root (CI, containers) that takes launch's opt-in.
AS_ROOT = LauncherOptions(allow_run_as_root=os.geteuid() == 0)
LOOPBACK_HOSTS = ["127.0.0.1", "127.0.0.2"]  # two "nodes" on this machine: distinct names, both loopback


def expected_topology(path: Path) -> Topology:
    """The topology a fixture's hand-checked expectation describes (independent of any parser)."""
    data = json.loads(path.read_text())
    gpus = [Gpu(g["id"], i, cpus=tuple(g["cpus"]) if g.get("cpus") else None, numa_node=g.get("numa_node"),
                gpu_numa_id=g.get("gpu_numa_id")) for i, g in enumerate(data["gpus"])]
    nics = [Nic(n["id"], i, name=n.get("name")) for i, n in enumerate(data["nics"])]
    codes = {tuple(pair.split("-")): code for pair, code in data["links"].items()}
    return build_topology(gpus, nics, codes, source=data["file"])


def block_placements(layout: Layout, gpu_ids: list[str], nodes: int = 1) -> list[RankPlacement]:
    """Ranks node by node, rank r of a node on gpu_ids[r]: what a launcher does without a planner."""
    return expand(layout, nodes, gpu_ids[:layout.world // nodes])


def local_topology(gpus: int, nic_name: str = "mlx5_0"):
    """`gpus` pretend GPUs whose CPU affinity is every CPU this process may use, on this machine's node."""
    cpus = tuple(sorted(os.sched_getaffinity(0)))
    node = next((n for n, c in FACTS.node_cpus.items() if set(cpus) <= set(c)), None)
    devices = [Gpu(f"GPU{i}", i, cpus=cpus, numa_node=node) for i in range(gpus)]
    codes = {(a.id, b.id): "NV4" for a in devices for b in devices if a.index < b.index}
    codes.update({(g.id, "NIC0"): "PIX" for g in devices})
    return build_topology(devices, [Nic("NIC0", 0, name=nic_name)], codes, source="this machine")


def child_env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMPI_MCA_plm_rsh_agent="false")  # Open MPI: never ssh, all local
    for name in ("TOPOPLAN_NODE", "OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"):
        env.pop(name, None)  # the emitted lines must bring what they need
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def generated_lines(stdout: str) -> list[str]:
    """The runner's human output: one `[i] 'text'` line per prompt."""
    return [line for line in stdout.splitlines() if line.startswith("[")]


MARK = "TOPOPLAN_TEST_MARK"  # set for a launched script: every process it starts inherits it


def marked_processes(mark: str) -> list[int]:
    """Processes whose environment carries MARK=mark (every descendant of the script inherits it)."""
    found = []
    needle = f"{MARK}={mark}".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if needle in (proc / "environ").read_bytes().split(b"\0"):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def _stat(pid: int | str) -> list[str]:
    """/proc/PID/stat's fields after the command name (state, ppid, pgrp, ...); [] when the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def server_group(script: int) -> list[int]:
    """The processes of the process group that a serve script (pid `script`) started its server in (`set -m`).
    vLLM renames its engine and workers (setproctitle), which overwrites their environment, so MARK cannot
    find them; their process group can."""
    groups = {fields[2] for proc in Path("/proc").iterdir() if proc.name.isdigit()
              if (fields := _stat(proc.name)) and fields[1] == str(script)}
    return [int(proc.name) for proc in Path("/proc").iterdir() if proc.name.isdigit()
            if (fields := _stat(proc.name)) and fields[2] in groups]


def mapped_shm(pids: list[int], prefix: str = "/dev/shm/") -> set[str]:
    """The files under `prefix` that processes `pids` have mapped (/proc/PID/maps)."""
    found = set()
    for pid in pids:
        try:
            found |= {line.split()[-1] for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
                      if line.split()[-1].startswith(prefix)}
        except OSError:
            continue
    return found
