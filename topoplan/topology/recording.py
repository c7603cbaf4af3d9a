"""Recordings: the raw NVML and sysfs answers of one machine as versioned JSON, and the one function that
turns them into a Topology. The live NVML source goes through the same function, so replaying a saved
recording gives exactly the graph the live query gave.

Schema (docs/nvml.md has the full description):

    {"format": "topoplan-nvml-recording", "schema_version": 1,
     "constructed": "...",                      # only in hand-written fixtures: what they were built from
     "environment": {"CUDA_VISIBLE_DEVICES": null | "...", "CUDA_DEVICE_ORDER": null | "..."},
     "nvml": {...},                              # nvml_query.query_nvml
     "sysfs": {"nics": [...], "pci": {...}},     # sysfs_nics.read_sysfs
     "cpu": {"model_name": "..." | null}}        # optional: /proc/cpuinfo's, for the SYS-hop figures
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from topoplan.architectures import ARCHITECTURES
from topoplan.atomic import write_atomic
from topoplan.cpuset import MAX_CPU
from topoplan.errors import TopoplanError
from topoplan.jsonfile import parse_json
from topoplan.limits import MAX_GPUS_PER_NODE, MAX_NICS_PER_NODE, MAX_NUMA_NODE
from topoplan.topology.cuda_numbering import GpuIdentity, default_order, pci_bus_order, visible_gpus
from topoplan.topology.links import NVLINK_VERSION_ARCH, cpu_family_of
from topoplan.topology.model import Gpu, Nic, Topology, build_topology
from topoplan.topology.nvml_query import NVML_FEATURE_ENABLED, is_error
from topoplan.topology.sysfs_nics import pci_link_code, sysfs_address
from topoplan.vendors import NVIDIA

FORMAT = "topoplan-nvml-recording"  # the "format" field every recording opens with; read.py detects it
SCHEMA_VERSION = 1
ENVIRONMENT_KEYS = (NVIDIA.visible_devices, NVIDIA.device_order[0])  # type: ignore[index]  # CUDA's: NVML machines

# nvmlDeviceGetTopologyCommonAncestor (nvmlGpuTopologyLevel_t) -> the `topo -m` code nvidia-smi prints.
# INTERNAL (two GPUs on one board, e.g. a K80) is as close as PCIe gets: PIX.
ANCESTOR_CODES = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
# nvmlDeviceGetP2PStatus (nvmlGpuP2PStatus_t) -> the letters of `nvidia-smi topo -p2p`'s legend.
P2P_CODES = {0: "OK", 1: "CNS", 2: "GNS", 3: "TNS", 4: "DR", 5: "NS", 6: "U"}
# nvmlDeviceGetNvLinkRemoteDeviceType (nvmlIntNvLinkDeviceType_t)
REMOTE_GPU, REMOTE_SWITCH = 0, 2

ESSENTIAL_FIELDS = ("handle", "name", "uuid", "pci_bus_id", "memory_total")
# Failures that only mean "this GPU or driver has no such thing": not a sign of a broken GPU.
BENIGN_ERRORS = {"NOT_SUPPORTED", "FUNCTION_NOT_FOUND", "INVALID_ARGUMENT"}


def new_recording(nvml: dict[str, Any], sysfs: dict[str, Any], environ: dict[str, str],
                  extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """A recording of this machine's answers, with the CUDA environment they were read under."""
    return {"format": FORMAT, "schema_version": SCHEMA_VERSION, **(extra or {}),
            "environment": {key: environ.get(key) for key in ENVIRONMENT_KEYS}, "nvml": nvml, "sysfs": sysfs}


def parse_recording(text: str, source: str) -> dict[str, Any]:
    """A recording from its JSON text, its format and schema version checked."""
    data = parse_json(text, source, "a topoplan recording")
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise TopoplanError(f"not a topoplan recording: expected \"format\": \"{FORMAT}\"", source=source)
    if data.get("schema_version") != SCHEMA_VERSION:
        raise TopoplanError(f"recording schema version {data.get('schema_version')!r}; this topoplan reads "
                            f"version {SCHEMA_VERSION}", source=source)
    for key, kind in (("nvml", dict), ("sysfs", dict), ("environment", dict)):
        if not isinstance(data.get(key), kind):
            raise TopoplanError(f"recording has no {key!r} object", source=source)
    return data


def save_recording(recording: dict[str, Any], path: str | Path) -> None:
    """Write a recording as JSON, all or nothing (a temporary file renamed over the target)."""
    write_atomic(path, json.dumps(recording, indent=1) + "\n")


# --- shape check: what the interpreter may then take for granted ---------------------------------------

_INTS, _STRS = ("list", int), ("list", str)
GPU_FIELDS = {"index": int, "handle": dict, "name": str, "uuid": str, "pci_bus_id": str, "memory_total": int,
              "cuda_compute_capability": _INTS, "cpu_affinity": _INTS, "cpu_affinity_any_scope": _INTS,
              "memory_affinity": _INTS, "numa_node_id": int, "nvlinks": ("list", dict), "fabric": dict}
FABRIC_FIELDS = {"cluster_uuid": str, "clique_id": int, "state": int, "status": int}
FABRIC_STATE_NOT_SUPPORTED = 0  # nvmlGpuFabricState_t: no NVLink fabric (a plain PCIe or HGX board)
FABRIC_STATE_COMPLETED = 3  # nvmlGpuFabricState_t: the fabric manager has placed this GPU in its NVLink domain
NVML_SUCCESS = 0
LINK_FIELDS = {"state": int, "version": int, "remote_pci_bus_id": str, "remote_device_type": int}
PAIR_FIELDS = {"a": int, "b": int, "common_ancestor": int, "p2p": dict}
NIC_FIELDS = {"name": str, "class": str, "pci_address": str}
PCI_FIELDS = {"path": _STRS, "numa_node": (int, type(None))}


def _check(value: Any, kind: Any, where: str, nvml: bool = True) -> None:
    """`value` is of `kind` (a type, a tuple of types, or ("list", item type)), or, for a field NVML answered
    (`nvml`), an NVML error answer; sysfs fields have no such answer."""
    if nvml and is_error(value) and isinstance(value["nvml_error"], str):
        return
    if isinstance(kind, tuple) and kind[:1] == ("list",):
        if not isinstance(value, list):
            raise ValueError(f"{where}: expected a list, found {value!r:.60}")
        for k, item in enumerate(value):
            _check(item, kind[1], f"{where}[{k}]", nvml)
    elif not isinstance(value, kind) or isinstance(value, bool) and kind is int:
        raise ValueError(f"{where}: expected {getattr(kind, '__name__', kind)}, found {value!r:.60}")


def _check_fields(entry: Any, fields: dict[str, Any], where: str, required: tuple[str, ...] = (),
                  nvml: bool = True) -> None:
    _check(entry, dict, where, nvml)
    for key in required:
        if key not in entry:
            raise ValueError(f"{where}: no {key!r}")
    for key, value in entry.items():
        if key in fields:
            _check(value, fields[key], f"{where}.{key}", nvml)


def check_shape(recording: dict[str, Any]) -> None:
    """Every field the interpreter reads has the type NVML or sysfs gives it; ValueError naming the first
    that does not."""
    nvml, sysfs = recording["nvml"], recording["sysfs"]
    _check(nvml.get("gpus"), ("list", dict), "nvml.gpus")
    _check(nvml.get("pairs"), ("list", dict), "nvml.pairs")
    for k, gpu in enumerate(nvml["gpus"]):
        _check_fields(gpu, GPU_FIELDS, f"nvml.gpus[{k}]", required=("index",))
        for j, link in enumerate(gpu.get("nvlinks", [])):
            _check_fields(link, LINK_FIELDS, f"nvml.gpus[{k}].nvlinks[{j}]")
        if "fabric" in gpu and not is_error(gpu["fabric"]):
            _check_fields(gpu["fabric"], FABRIC_FIELDS, f"nvml.gpus[{k}].fabric", required=tuple(FABRIC_FIELDS))
    for k, pair in enumerate(nvml["pairs"]):
        _check_fields(pair, PAIR_FIELDS, f"nvml.pairs[{k}]", required=("a", "b"))
        for letter, status in pair.get("p2p", {}).items():
            _check(status, int, f"nvml.pairs[{k}].p2p.{letter}")
    _check(sysfs.get("nics"), ("list", dict), "sysfs.nics", nvml=False)
    _check(sysfs.get("pci"), dict, "sysfs.pci", nvml=False)
    for k, nic in enumerate(sysfs["nics"]):
        _check_fields(nic, NIC_FIELDS, f"sysfs.nics[{k}]", required=tuple(NIC_FIELDS), nvml=False)
    for address, place in sysfs["pci"].items():
        _check_fields(place, PCI_FIELDS, f"sysfs.pci[{address!r}]", required=tuple(PCI_FIELDS), nvml=False)
    if "cpu" in recording:
        _check_fields(recording["cpu"], {"model_name": (str, type(None))}, "cpu", required=("model_name",))
    check_ranges(recording)


def _in_range(value: Any, low: int, high: int, where: str) -> None:
    if isinstance(value, int) and not is_error(value) and not low <= value <= high:
        raise ValueError(f"{where}: expected {low}..{high}, found {value}")


def check_ranges(recording: dict[str, Any]) -> None:
    """Counts and numbers a real machine can report (topoplan.limits): no negative GPU index or NUMA node
    (it would reach CUDA_VISIBLE_DEVICES and numactl), no 2,000-NIC node (it would cost minutes)."""
    nvml, sysfs = recording["nvml"], recording["sysfs"]
    if len(nvml["gpus"]) > MAX_GPUS_PER_NODE or len(sysfs["nics"]) > MAX_NICS_PER_NODE:
        raise ValueError(f"{len(nvml['gpus'])} GPUs and {len(sysfs['nics'])} NICs; one node has at most "
                         f"{MAX_GPUS_PER_NODE} GPUs and {MAX_NICS_PER_NODE} NICs")
    if len(nvml["pairs"]) > len(nvml["gpus"]) ** 2 or len(sysfs["pci"]) > 16 * MAX_NICS_PER_NODE:
        raise ValueError(f"{len(nvml['pairs'])} GPU pairs and {len(sysfs['pci'])} PCI entries: more than "
                         f"{len(nvml['gpus'])} GPUs and {MAX_NICS_PER_NODE} NICs can have")
    for k, gpu in enumerate(nvml["gpus"]):
        _in_range(gpu["index"], 0, MAX_GPUS_PER_NODE - 1, f"nvml.gpus[{k}].index")
        _in_range(gpu.get("numa_node_id"), -1, MAX_NUMA_NODE, f"nvml.gpus[{k}].numa_node_id")
        _in_range(gpu.get("memory_total"), 0, 2**50, f"nvml.gpus[{k}].memory_total")
        for field in ("cpu_affinity", "cpu_affinity_any_scope", "memory_affinity"):
            words = gpu.get(field)
            if isinstance(words, list):
                if len(words) > (MAX_CPU + 1) // 64:
                    raise ValueError(f"nvml.gpus[{k}].{field}: {len(words)} mask words; expected at most "
                                     f"{(MAX_CPU + 1) // 64}")
                for j, word in enumerate(words):
                    _in_range(word, 0, 2**64 - 1, f"nvml.gpus[{k}].{field}[{j}]")
        if len(gpu.get("nvlinks", [])) > 64:
            raise ValueError(f"nvml.gpus[{k}].nvlinks: {len(gpu['nvlinks'])} links; a GPU has at most 18")
    for k, pair in enumerate(nvml["pairs"]):
        for end in ("a", "b"):
            _in_range(pair[end], 0, MAX_GPUS_PER_NODE - 1, f"nvml.pairs[{k}].{end}")
    for address, place in sysfs["pci"].items():
        _in_range(place["numa_node"], -1, MAX_NUMA_NODE, f"sysfs.pci[{address!r}].numa_node")


# --- interpretation -------------------------------------------------------------------------------------


def _value(answer: Any) -> Any:
    """The answer, or None when NVML refused it."""
    return None if answer is None or is_error(answer) else answer


def _bits(words: Any) -> list[int] | None:
    """Bit numbers set in an NVML bitmask (a list of 64-bit words, lowest first)."""
    if not isinstance(words, list):
        return None
    return [64 * k + bit for k, word in enumerate(words) for bit in range(64) if word >> bit & 1]


def _node(number: int | None) -> int | None:
    """sysfs writes -1 for "no NUMA node" (one-node machines): that is None, never a node to bind to."""
    return number if number is not None and number >= 0 else None


def _gpu_error(raw: dict[str, Any]) -> str | None:
    """Which queries failed on this GPU in a way that says the GPU itself is in trouble."""
    failed = [f"{field}: {raw[field]['nvml_error']}" for field in raw
              if is_error(raw[field]) and (field in ESSENTIAL_FIELDS or raw[field]["nvml_error"] not in BENIGN_ERRORS)]
    failed += [f"nvlink {k} {field}: {answer['nvml_error']}" for k, link in enumerate(raw.get("nvlinks", []))
               for field, answer in link.items() if is_error(answer) and answer["nvml_error"] not in BENIGN_ERRORS]
    return f"NVML could not read it ({'; '.join(failed)})" if failed else None


class _Interpreter:
    """Turns one recording into the pieces build_topology takes, collecting notes on what it inferred."""

    def __init__(self, recording: dict[str, Any]):
        self.nvml = recording["nvml"]
        self.sysfs = recording["sysfs"]
        self.env = recording["environment"]
        self.raw_gpus: list[dict[str, Any]] = self.nvml["gpus"]
        self.notes: list[str] = []
        self.ids = [f"GPU{g['index']}" for g in self.raw_gpus]
        self.assumed_sys: list[str] = []  # pairs nothing placed: see pci_code
        self.identities = [GpuIdentity(_value(g.get("pci_bus_id")), _value(g.get("uuid")), _value(g.get("name")))
                           for g in self.raw_gpus]
        self.by_bus = {sysfs_address(g.bus_id): i for i, g in enumerate(self.identities) if g.bus_id}

    def gpu_pci(self, i: int) -> dict[str, Any] | None:
        bus = self.identities[i].bus_id
        return self.sysfs["pci"].get(sysfs_address(bus)) if bus else None

    # --- devices ---------------------------------------------------------------------------------------
    def gpus(self) -> list[Gpu]:
        pci_order = pci_bus_order(self.identities)
        default = default_order(self.identities)
        if default is None and len(self.raw_gpus) > 1:
            self.notes.append("CUDA's default order (FASTEST_FIRST) cannot be predicted here (the GPUs differ, or "
                              "one did not say what it is); set CUDA_DEVICE_ORDER=PCI_BUS_ID to count like nvidia-smi")
        order = pci_order if self.env.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID" else default
        visible, notes = visible_gpus(self.env.get(NVIDIA.visible_devices), order, self.identities)
        self.notes += notes
        gpus = []
        for i, raw in enumerate(self.raw_gpus):
            error = _gpu_error(raw)
            if error:
                self.notes.append(f"{self.ids[i]}: {error}; it is listed, but what NVML could not say is unknown")
            numa = self.numa_node(i, raw)
            gpu_numa = _value(raw.get("numa_node_id"))
            cpus = _bits(_value(raw.get("cpu_affinity")) or _value(raw.get("cpu_affinity_any_scope")))
            ident = self.identities[i]
            gpus.append(Gpu(
                self.ids[i], raw["index"], name=ident.name, pci_bus_id=ident.bus_id, uuid=ident.uuid,
                cpus=tuple(cpus) if cpus else None, numa_node=numa,
                # Grace: the GPU's memory is a NUMA node of its own, never the node of its CPU affinity
                gpu_numa_id=gpu_numa if isinstance(gpu_numa, int) and gpu_numa >= 0 and gpu_numa != numa else None,
                memory_bytes=_value(raw.get("memory_total")), cuda_index_pci_bus=pci_order[i],
                cuda_index_default=default[i] if default else None, visible=visible[i], error=error,
                fabric_domain=self.fabric_domain(i, raw)))
        return gpus

    def fabric_domain(self, i: int, raw: dict[str, Any]) -> str | None:
        """"clusterUuid/cliqueId" once the fabric manager has placed the GPU in a multi-node NVLink domain; a
        GPU on such a fabric that is not (yet) placed gets a note, since it cannot reach other trays."""
        fabric = _value(raw.get("fabric"))
        if not fabric or fabric["state"] == FABRIC_STATE_NOT_SUPPORTED:
            return None
        zero = fabric["cluster_uuid"].replace("0", "").replace("-", "") == ""
        if fabric["state"] == FABRIC_STATE_COMPLETED and fabric["status"] == NVML_SUCCESS and not zero:
            return f"{fabric['cluster_uuid']}/{fabric['clique_id']}"
        if fabric["state"] != FABRIC_STATE_COMPLETED or fabric["status"] != NVML_SUCCESS:
            self.notes.append(f"{self.ids[i]}: NVLink fabric not ready (state {fabric['state']}, status "
                              f"{fabric['status']}): it is not counted in a multi-node NVLink domain")
        return None

    def numa_node(self, i: int, raw: dict[str, Any]) -> int | None:
        nodes = _bits(_value(raw.get("memory_affinity")))
        if nodes and len(nodes) == 1:
            return nodes[0]
        if nodes:
            self.notes.append(f"{self.ids[i]}: NVML gives memory affinity to NUMA nodes {nodes}; no single node shown")
            return None
        return _node((self.gpu_pci(i) or {}).get("numa_node"))  # sysfs: the PCI device's own numa_node

    def nics(self) -> list[Nic]:
        return [Nic(f"NIC{k}", k, nic["name"], nic["pci_address"],
                    _node(self.sysfs["pci"].get(nic["pci_address"], {}).get("numa_node")))
                for k, nic in enumerate(self.sysfs["nics"])]

    # --- links ---------------------------------------------------------------------------------------
    def nvlink_counts(self) -> dict[tuple[int, int], int]:
        """NVLinks per GPU pair: direct links counted by the far end's bus id, plus, for two GPUs on an
        NVSwitch fabric, the smaller of their switch-link counts (each GPU's traffic to the other crosses
        its own switch links)."""
        direct: Counter[tuple[int, int]] = Counter()
        to_switch: Counter[int] = Counter()
        unknown = 0
        for i, raw in enumerate(self.raw_gpus):
            for link in raw.get("nvlinks", []):
                if link.get("state") != NVML_FEATURE_ENABLED:
                    continue
                remote_bus = _value(link.get("remote_pci_bus_id"))
                peer = self.by_bus.get(sysfs_address(remote_bus)) if remote_bus else None
                kind = _value(link.get("remote_device_type"))
                if kind == REMOTE_SWITCH:
                    to_switch[i] += 1
                elif peer is not None and kind in (REMOTE_GPU, None):
                    direct[i, peer] += 1
                elif kind is None:
                    unknown += 1
        if unknown:
            self.notes.append(f"{unknown} active NVLinks lead to a device NVML does not name and that is no GPU; "
                              "they are left out")
        counts = {}
        for a in range(len(self.raw_gpus)):
            for b in range(a + 1, len(self.raw_gpus)):
                through_switch = min(to_switch[a], to_switch[b])
                counts[a, b] = direct[a, b] + through_switch
        return counts

    def codes(self, nics: list[Nic]) -> tuple[dict[tuple[str, str], str], dict[tuple[str, str], dict[str, str]]]:
        nv = self.nvlink_counts()
        pairs = {(p["a"], p["b"]): p for p in self.nvml["pairs"]}
        codes: dict[tuple[str, str], str] = {}
        p2p: dict[tuple[str, str], dict[str, str]] = {}
        n = len(self.raw_gpus)
        for a in range(n):
            for b in range(a + 1, n):
                key = (self.ids[a], self.ids[b])
                pair = pairs.get((self.raw_gpus[a]["index"], self.raw_gpus[b]["index"]), {})
                ancestor = _value(pair.get("common_ancestor"))
                codes[key] = (f"NV{nv[a, b]}" if nv[a, b] else ANCESTOR_CODES.get(ancestor)
                              or self.pci_code(key, self.gpu_pci(a), self.gpu_pci(b)))
                statuses = {k: P2P_CODES.get(v, "U") for k, v in pair.get("p2p", {}).items() if not is_error(v)}
                if statuses:
                    p2p[key] = statuses
        nic_pci = [self.sysfs["pci"].get(nic.pci_bus_id) for nic in nics]
        for k, nic in enumerate(nics):
            for a in range(n):
                codes[self.ids[a], nic.id] = self.pci_code((self.ids[a], nic.id), self.gpu_pci(a), nic_pci[k])
            for j in range(k + 1, len(nics)):
                codes[nic.id, nics[j].id] = self.pci_code((nic.id, nics[j].id), nic_pci[k], nic_pci[j])
        if self.assumed_sys:
            self.notes.append("neither NVML nor the PCI tree says how these connect, so they are shown as SYS "
                              f"(the farthest): {', '.join(self.assumed_sys)}")
        return codes, p2p

    def pci_code(self, pair: tuple[str, str], a: dict[str, Any] | None, b: dict[str, Any] | None) -> str:
        code = pci_link_code(a, b)
        if code is None:
            self.assumed_sys.append(f"{pair[0]}-{pair[1]}")
            return "SYS"
        return code

    # --- generation ----------------------------------------------------------------------------------
    def arch_and_name(self) -> tuple[str | None, str | None]:
        """The generation the compute capability gives, and the one name every GPU reports (NVML's own
        spelling; topoplan.hardware maps it to the catalog, which the topology layer does not know)."""
        names = {g.name for g in self.identities if g.name}
        name = next(iter(names)) if len(names) == 1 else None
        archs = {f"sm{cc[0]}{cc[1]}" for g in self.raw_gpus if (cc := _value(g.get("cuda_compute_capability")))}
        if len(archs) > 1:
            self.notes.append(f"mixed GPU generations ({', '.join(sorted(archs))}): link figures use NCCL's defaults")
            return None, None
        arch = next(iter(archs)) if archs else None
        if arch is not None and arch not in ARCHITECTURES:
            versions = {v for g in self.raw_gpus for link in g.get("nvlinks", [])
                        if isinstance(v := _value(link.get("version")), int)}
            by_version = {NVLINK_VERSION_ARCH[v] for v in versions if v in NVLINK_VERSION_ARCH}
            if len(by_version) == 1:
                fallback = by_version.pop()
                self.notes.append(f"{arch} has no link figures; NVLink version {sorted(versions)} -> {fallback} "
                                  "figures")
                arch = fallback
        return arch, name


def topology_from_recording(recording: dict[str, Any], source: str = "") -> Topology:
    """The topology a recording describes; a damaged recording is a TopoplanError naming what is wrong."""
    try:
        check_shape(recording)
        reader = _Interpreter(recording)
        gpus = reader.gpus()
        nics = reader.nics()
        codes, p2p = reader.codes(nics)
        arch, gpu_name = reader.arch_and_name()
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as error:
        raise TopoplanError(f"damaged recording ({type(error).__name__}: {error})", source=source or None) from None
    model_name = recording.get("cpu", {}).get("model_name")
    cpu = cpu_family_of(model_name) if isinstance(model_name, str) else None
    if cpu is not None:
        reader.notes.append(f"CPU family {cpu} (SYS-hop figures) from the recorded CPU model {model_name!r}")
    return build_topology(gpus, nics, codes, arch=arch, gpu_name=gpu_name, p2p=p2p, source=source,
                          notes=reader.notes, vendor="nvidia", cpu=cpu)
