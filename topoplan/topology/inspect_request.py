"""What `topoplan inspect` is asked: where the topology comes from and how it is shown. Its fields declare the
command's options (topoplan.option_fields); light, because inspect's start-up is the one measured
(benchmarks/cli_latency.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from topoplan.errors import TopoplanError
from topoplan.option_fields import option

FORMATS = ("table", "json", "dot", "mermaid", "svg", "png", "nccl-xml")  # topoplan.topology.render.emit's


@dataclass(frozen=True)
class InspectRequest:
    file: str | None = field(default=None, metadata=option(
        "--topo", "--file", "-f", metavar="PATH", help="A saved `nvidia-smi topo -m` paste, NVML recording, NCCL "
        "topology XML, `rocm-smi --showtopo` or `amd-smi topology` output ('-': stdin); --file is the same option. "
        "Default: read this machine."))
    source: str = field(default="auto", metadata=option("--source", choices=("auto", "nvml", "smi", "file"),
                                                        help="auto: --file if given, else NVML, else `nvidia-smi topo "
                                                             "-m`."))
    save: str | None = field(default=None, metadata=option("--save", metavar="FILE", help="Also write NVML's raw "
                                                           "answers to FILE (JSON), to replay with --file."))
    gpu: str | None = field(default=None, metadata=option("--gpu", metavar="NAME", help="The GPU model (e.g. "
                                                          "h100-sxm), for pastes, which do not name it."))
    p2p: str | None = field(default=None, metadata=option("--p2p", metavar="FILE", help="A `nvidia-smi topo -p2p "
                                                          "r|w|n|a|p` matrix to attach."))
    format: str | None = field(default=None, metadata=option(
        "--format", choices=FORMATS, help="Output format (default table); svg/png need -o; nccl-xml writes a file for "
        "NCCL_TOPO_FILE."))
    json: bool = field(default=False, metadata=option("--json", help="Same as --format json."))
    output: str | None = field(default=None, metadata=option("--output", "-o", metavar="FILE", help="Write to FILE "
                                                             "instead of stdout."))
    allow_invented_bus_ids: bool = field(default=False, metadata=option(
        "--allow-invented-bus-ids", help="--format nccl-xml: write made-up PCI bus ids where the source gives none "
        "(NCCL matches devices by bus id: for reading back, not for NCCL)."))

    def __post_init__(self) -> None:
        if self.json and self.format not in (None, "json"):
            raise TopoplanError(f"--json and --format {self.format} ask for two formats: pass one")

    @property
    def chosen_format(self) -> str:
        return "json" if self.json else self.format or "table"
