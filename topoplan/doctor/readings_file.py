"""Doctor recordings as files: `doctor --save` writes one (atomically), `doctor --file` reads one back, its
format, version and the shape of every field the checks read checked first (schema.py).

Schema (docs/doctor.md describes each part):

    {"format": "topoplan-doctor-recording", "schema_version": 1,
     "built_by_hand": false | "what was changed, from what, to show which failure",
     "pci": {ADDR: {"role": "gpu"|"nic", vendor, class, current/max link speed/width, numa_node, local_cpulist,
                    "iommu_group": null | {"group", "type"}, "bridges": [ADDR...]}
             | {"role": "bridge", "acs_control": int | null | {"unreadable": why}}},
     "iommu": {"groups": int | unreadable, "units": [...], "iommu_args": [the kernel command line's iommu words]},
     "infiniband": {DEV: {"ports": {N: {state, phys_state, rate, link_layer}}}},
     "net": {IFACE: {operstate, speed, "pci_address": null | ADDR}},
     "numa_balancing": reading, "shm": {"total_bytes", "free_bytes"} | unreadable,
     "memlock": {"soft", "hard"}: bytes | "unlimited",
     "cpus": {online, cpus_allowed_list, "governors": {CPU: reading}, scaling_driver},
     "nvml": {"skipped": why} | topology.nvml_query's answers + per-GPU persistence_mode, pcie, retired_pages}

Every reading is the file's text or {"unreadable": why}.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from topoplan.atomic import write_atomic
from topoplan.doctor.schema import (
    ANYTHING,
    BOOL,
    CPU_NUMBER,
    INT,
    NVML_ANSWER,
    NVML_INT,
    READING,
    TEXT,
    UNREADABLE,
    Fields,
    Leaf,
    ListOf,
    MapOf,
    OneOf,
    check_shape,
)
from topoplan.errors import TopoplanError
from topoplan.jsonfile import read_json

FORMAT = "topoplan-doctor-recording"
SCHEMA_VERSION = 1

_INT_OR_UNREADABLE = OneOf((INT, UNREADABLE), 'an integer or {"unreadable": why}')
_LIMIT = OneOf((INT, Leaf('"unlimited"', lambda v: v == "unlimited")), 'bytes or "unlimited"')
_DEVICE = Fields({"role": Leaf('"gpu" or "nic"', lambda v: v in ("gpu", "nic")), "vendor": READING,
                  "class": READING, "current_link_speed": READING, "max_link_speed": READING,
                  "current_link_width": READING, "max_link_width": READING, "numa_node": READING,
                  "local_cpulist": READING, "bridges": ListOf(TEXT),
                  "iommu_group": OneOf((Leaf("null", lambda v: v is None), Fields({"group": TEXT, "type": READING})),
                                       'null or {"group": N, "type": reading}')})
_BRIDGE = Fields({"role": Leaf('"bridge"', lambda v: v == "bridge"),
                  "acs_control": OneOf((INT, Leaf("null", lambda v: v is None), UNREADABLE),
                                       'the ACS Control register, null (no ACS) or {"unreadable": why}')})
_GPU = Fields({"index": INT},
              {"persistence_mode": NVML_INT, "name": NVML_ANSWER, "pci_bus_id": NVML_ANSWER,
               "nvlinks": ListOf(Fields({"state": NVML_INT}, extra=True)),
               "pcie": Fields({k: NVML_INT for k in ("current_generation", "max_generation", "current_width",
                                                     "max_width")}),
               "retired_pages": Fields({k: NVML_INT for k in ("single_bit_ecc", "double_bit_ecc", "pending")})},
              extra=True)
_PAIR = Fields({"a": INT, "b": INT}, {"p2p": MapOf(NVML_INT)}, extra=True)
_NVML = OneOf((Fields({"skipped": TEXT}), Fields({"gpus": ListOf(_GPU), "pairs": ListOf(_PAIR)}, extra=True)),
              'NVML\'s answers ({"gpus": [...], "pairs": [...]}) or {"skipped": why}')
SHAPE = Fields({
    "format": Leaf(f'"{FORMAT}"', lambda v: v == FORMAT),
    "schema_version": Leaf(str(SCHEMA_VERSION), lambda v: v == SCHEMA_VERSION),
    "built_by_hand": OneOf((BOOL, TEXT), "false, or text saying how the recording was built"),
    "pci": MapOf(OneOf((_DEVICE, _BRIDGE), "a GPU, NIC or bridge entry (see docs/doctor.md)")),
    "iommu": Fields({"groups": _INT_OR_UNREADABLE, "units": ListOf(TEXT),
                     "iommu_args": OneOf((ListOf(TEXT), UNREADABLE), 'the kernel command line\'s IOMMU words or '
                                         '{"unreadable": why}')}),
    "infiniband": MapOf(Fields({"ports": MapOf(Fields({"state": READING, "phys_state": READING, "rate": READING,
                                                       "link_layer": READING}))})),
    "net": MapOf(Fields({"operstate": READING, "speed": READING,
                         "pci_address": OneOf((TEXT, Leaf("null", lambda v: v is None)), "a PCI address or null")})),
    "numa_balancing": READING,
    "shm": OneOf((Fields({"total_bytes": INT, "free_bytes": INT}), UNREADABLE),
                 '{"total_bytes", "free_bytes"} or {"unreadable": why}'),
    "memlock": Fields({"soft": _LIMIT, "hard": _LIMIT}),
    "cpus": Fields({"online": READING, "cpus_allowed_list": READING, "governors": MapOf(READING, CPU_NUMBER),
                    "scaling_driver": READING}),
    "nvml": _NVML,
}, {"description": TEXT, "timings": ANYTHING})


def save_recording(recording: dict[str, Any], path: str | Path) -> None:
    write_atomic(path, json.dumps(recording, indent=1) + "\n")


def load_recording(path: str | Path) -> dict[str, Any]:
    """A saved recording, refused in one line (file and field) when it is not one or is damaged."""
    data = read_json(path, "a topoplan doctor recording")
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise TopoplanError(f'field format: expected "{FORMAT}" (a file from `topoplan doctor --save`)',
                            source=path)
    check_shape(data, SHAPE, str(path))
    return data
