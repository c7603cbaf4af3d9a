"""Predicted vs published: the planner's cost model on the measurements in data/published_measurements.json.

Shared by tests/test_validation.py (tolerances) and benchmarks/validation_table.py (the docs table).
Every case uses the default calibration: the same constants for all of them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from topoplan.hardware import find_gpu
from topoplan.layout import Layout
from topoplan.models import spec_from_config
from topoplan.plan.calibration import Calibration
from topoplan.plan.collectives import LinkPricer, Ring
from topoplan.plan.cost import CostModel, LayoutCost, Workload, replica_rings
from topoplan.plan.device import DeviceSpec
from topoplan.plan.placement import NodePlacer
from topoplan.topology.model import Gpu, build_topology
from topoplan.topology.read import read_topology

ROOT = Path(__file__).resolve().parent.parent
PUBLISHED = json.loads((ROOT / "tests" / "data" / "published_measurements.json").read_text())
DGX_A100 = ROOT / "fixtures" / "topo" / "00_dgx-a100-8gpu-nv12-10nic-gpu-rows-only.txt"


@dataclass(frozen=True)
class Row:
    case: str
    quantity: str
    predicted: float
    published: float

    @property
    def error(self) -> float:
        return self.predicted / self.published - 1


def _price(entry: dict, tp: int, work: Workload) -> LayoutCost:
    gpu = find_gpu(entry["gpu"])
    topo = read_topology(str(DGX_A100)).with_arch(gpu.arch, gpu.key)
    model = spec_from_config(entry["model"], entry["source"])
    device, cal = DeviceSpec.from_gpu(gpu), Calibration()
    layout = Layout(tp=tp)
    rings = replica_rings(layout, NodePlacer(topo).local_order(layout))
    return CostModel(model, device, work, cal, LinkPricer(topo, cal, device.nic_gbps)).price(layout, rings)


def ft_gpt20b_rows() -> list[Row]:
    """Per output token = total request latency / generated tokens, as the published table divides it."""
    entry, rows = PUBLISHED["ft_gpt20b_a100_80gb"], []
    for key in ("batch1", "batch256"):
        run = entry[key]
        work = Workload(run["batch"], run["prompt_len"], run["gen_len"], "fp16")
        for tp, total in run["total_ms"].items():
            cost = _price(entry, int(tp), work)
            rows.append(Row(f"FT GPT-20B A100-80GB batch {run['batch']} TP{tp}", "ms/token (total/gen)",
                            cost.request_ms / run["gen_len"], total / run["gen_len"]))
    return rows


def ft_13b_rows() -> list[Row]:
    entry, rows = PUBLISHED["ft_13b_a100_40gb"], []
    work = Workload(entry["batch"], entry["prompt_len"], entry["gen_len"], "fp16")
    for tp in entry["decode_ms_per_token"]:
        cost = _price(entry, int(tp), work)
        rows.append(Row(f"FT 13B A100-40GB TP{tp}", "decode ms/token", cost.decode_ms_per_token,
                        entry["decode_ms_per_token"][tp]))
        rows.append(Row(f"FT 13B A100-40GB TP{tp}", "prefill ms (512 tokens)", cost.prefill_ms,
                        entry["prefill_ms"][tp]))
    return rows


def allreduce_rows() -> list[Row]:
    entry = PUBLISHED["allreduce_dgx_a100"]
    gpu = find_gpu("a100-sxm4-80gb")
    topo = read_topology(str(DGX_A100)).with_arch(gpu.arch, gpu.key)
    pricer = LinkPricer(topo, Calibration(), 25.0)
    rows = []
    for ranks, times in entry["time_us"].items():
        ring = Ring.of([(0, f"GPU{i}") for i in range(int(ranks))])
        for size, published in zip(entry["sizes_bytes"], times):
            rows.append(Row(f"all-reduce DGX-A100 {ranks} ranks", f"{size // 1024} KiB us",
                            pricer.allreduce_us(ring, size), published))
    return rows


def _pair_busbw(code: str, gpu_key: str, n: int = 2) -> float:
    """Large-message bus bandwidth the model gives a ring of n GPUs joined pairwise by `code`."""
    arch = find_gpu(gpu_key).arch
    gpus = [Gpu(f"GPU{i}", i) for i in range(n)]
    topo = build_topology(gpus, [], {(a.id, b.id): code for a in gpus for b in gpus if a.index < b.index}, arch=arch)
    return LinkPricer(topo, Calibration(), 25.0).bottleneck(Ring.of([(0, g.id) for g in gpus])).bandwidth_gbps


# (system, the topology the model is given) for each nccl-tests report
BUSBW_MODEL = {
    "8x A100 SXM (NVSwitch)": lambda: _pair_busbw("NV12", "a100-sxm4-80gb", 8),
    "A100 PCIe NV12-bridged pair": lambda: _pair_busbw("NV12", "a100-pcie-80gb"),
    "A100 PCIe ring crossing NODE": lambda: _pair_busbw("NODE", "a100-pcie-80gb"),
    "2x H100 PCIe NVLink-bridged": lambda: _pair_busbw("NV12", "h100-pcie"),
    "4x RTX 5090 PCIe 5": lambda: _pair_busbw("PHB", "rtx-5090", 4),
    "8x RTX 5090 PCIe 5": lambda: _pair_busbw("PHB", "rtx-5090", 8),
}


def mixtral_rows() -> list[Row]:
    """An MoE at batch 1 (two of eight experts read per token): Baseten's single-A100 TensorRT-LLM figures."""
    entry = PUBLISHED["baseten_mixtral_a100_int8"]
    cost = _price(entry, 1, Workload(entry["batch"], entry["prompt_len"], entry["gen_len"], entry["dtype"]))
    return [Row("Mixtral-8x7B A100 int8 batch 1", "ms/token (total/gen)", cost.request_ms / entry["gen_len"],
                1e3 / entry["perceived_tokens_per_s"]),
            Row("Mixtral-8x7B A100 int8 batch 1", "TTFT ms (512 tokens)", cost.prefill_ms, entry["ttft_ms"])]


def busbw_rows() -> list[Row]:
    return [Row(c["system"], "busbw GB/s", BUSBW_MODEL[c["system"]](), c["busbw"])
            for c in PUBLISHED["busbw_gbps"]["cases"]]
