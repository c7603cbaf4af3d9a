"""The `cpu` hardware entry: how the planner plans CPU-process layouts on this machine.

A CPU "device" is the set of cores one rank runs on (`threads` of them; with one thread per rank, one
core). `cpu_topology(n)` is n such devices, CPU0..CPU{n-1}, on one NUMA node, every pair joined by the
`node` link class: gloo between processes of one NUMA node goes through the loopback TCP stack and
shared memory, never a PCIe path, so the class exists only to carry the alpha and bandwidth that
`topoplan calibrate` measured for it. `cpu_device` turns the probes of the calibration file's `cpu`
entry into the three figures the roofline needs:

  memory bandwidth per rank = min(gemv[threads], gemv[all cores] / concurrent)
      (a rank is limited by what its own cores can pull and by its share of the socket: the ranks that
       stream weights at the same time split the memory bus. For a prefill those are the tp x dp ranks
       of one pipeline stage: stages run one after another, a waiting stage reads nothing. In decode the
       runner keeps min(pp, batch) micro-batches in flight, so that many stages stream at once).
       GEMV, not the stream probe, is the device's bandwidth: it is what decode's matrix-vector
       products reach, while a plain sum is compute-bound on some cores. The stream figure is recorded
       beside it for comparison;
  FLOP/s per rank           = matmul[threads][rows] (compute does not contend), the FLOP rate of a
      product with `rows` rows (tokens) against a weight larger than the cache, interpolated in log2(rows):
      a CPU's rate for a decode step's few rows is a fraction of its rate for prefill's many, so decode and
      prefill are priced with the device at their own rows; the device also carries the whole curve
      (`tflops_by_rows`), for an MoE layer's experts, which each multiply a fraction of the rows. The curve is
      the one of the kernel the runner holds its weights for: the faster at the decode step's rows
      (`matmul_tflops_by_kernel`; topoplan.runner.cpu_linear), which then multiplies prefill's rows too;
  memory per rank           = RAM x threads / cores.
and `cpu_calibration` sets the planner's layer, MoE-layer, per-expert and step overheads to the probes'
figures for that thread count, and its per-product cost (`matmul_call_us`) to the probe's at the step's rows:
the runner's kernel for one row may differ from the one for more (topoplan.runner.cpu_linear), so the probe
measures both. The layer overhead depends on how much a layer streams: a layer whose weights stay in cache runs
its small kernels warm, one that streams tens of MB between them runs them cold, at ~3x the cost on the 2-core
Intel VM (topoplan.bench.probes.streamed_layer_overhead_us). `layer_overhead_by_bytes` holds the figure at the
cached probe's and the streamed probe's layer sizes, and a rank's layer of B bytes is priced between them,
linear in B (the ends beyond them): measured in place on the Intel VM (2 threads, batch 2) at hidden 64, 128
(`tiny`, 0.8 MB a layer), 256, 512 and 1024 it was 114, 128, 158, 243 and 381 us; a line through the ends gives
~128 for `tiny` and is 18 and 58 us under the middle two, where one in log2(B) was 70-90 us over all three.
The entry (written by `topoplan calibrate` on a CPU machine; docs/bench.md):
    "cpu": {"cores": 2, "numa_nodes": 1, "memory_bytes": 2.4e10, "dtype": "fp32",
            "threads": {"1": {"stream_gbps": .., "gemv_gbps": .., "gemm_tflops": ..,
                              "matmul_tflops": {"1": .., "2": .., ..., "256": ..},
                              "matmul_tflops_by_kernel": {"mkl": {"1": .., ...}, "onednn": {"1": .., ...}},
                              "layer_overhead_us": .., "step_overhead_us": ..,
                              "layer_overhead_by_bytes": {"147456": .., "47185920": ..},
                              "moe_layer_overhead_us": .., "expert_overhead_us": ..,
                              "matmul_call_us": {"1": .., "2": ..}},
                        "2": {...}}}
"""

from __future__ import annotations

from dataclasses import replace

from topoplan.layout import Layout
from topoplan.machine import CPU_LINK, cpu_topology  # noqa: F401  (re-exported: the bench's CPU machine)
from topoplan.plan.calibration import Calibration
from topoplan.plan.calibration_file import CpuEntry, Points, Probes
from topoplan.plan.device import DeviceSpec, linear_interpolate, log_interpolate

# the runner's MoE-layer costs (Calibration fields of the same names); absent from files written before them
MOE_OVERHEADS = ("moe_layer_overhead_us", "expert_overhead_us")


def concurrent_ranks(layout: Layout, busy_stages: int = 1) -> int:
    """Ranks streaming weights at once: the TP groups of `busy_stages` stages in every replica (1 while one
    batch walks down the pipeline; one per micro-batch in flight when the runner micro-batches decode)."""
    return layout.tp * layout.dp * busy_stages


def runner_curve(probes: Probes, decode_rows: float) -> Points:
    """(rows, TFLOP/s) of the kernel a runner rank whose decode step multiplies `decode_rows` rows holds its
    weights for: the one faster at those rows (module docstring); in a file without the per-kernel curves, the
    faster kernel at each row count."""
    by_kernel = probes.matmul_tflops_by_kernel
    if not by_kernel:
        return probes.matmul_tflops
    return max(by_kernel.values(), key=lambda c: log_interpolate(c, decode_rows))


def cpu_device(entry: CpuEntry, threads: int, concurrent: int, rows: float,
               decode_rows: float | None = None) -> DeviceSpec:
    """The device a rank of `threads` threads sees while `concurrent` ranks share the memory bus, for
    matrix products of `rows` rows, its weights held for the kernel faster at `decode_rows` (default `rows`)
    (formulas above)."""
    mine, socket = entry.probes(threads), entry.probes(entry.cores)
    bandwidth = min(mine.gemv_gbps, socket.gemv_gbps / concurrent)
    curve = runner_curve(mine, rows if decode_rows is None else decode_rows)
    tflops = log_interpolate(curve, rows)
    return DeviceSpec(name=f"cpu x{threads} thread{'s' if threads > 1 else ''}",
                      memory_bytes=entry.memory_bytes * threads / entry.cores,
                      memory_bandwidth_gbps=bandwidth,
                      tflops={"fp32": tflops, "bf16": tflops, "fp16": tflops, "fp8": tflops},
                      nic_gbps=1.0,  # unused: one machine, no network hop
                      tflops_by_rows=curve)


def call_us(points: Points, rows: float) -> float:
    """The per-product cost probed at the most rows not above `rows` (the fewest probed below that)."""
    return next((v for r, v in reversed(points) if r <= rows), points[0][1])


def layer_overhead_us(probes: Probes, layer_bytes: float) -> float:
    """A layer's fixed cost for a rank that holds `layer_bytes` of its weights (module docstring); the cached
    probe's figure in a file from before the streamed probe."""
    curve = probes.layer_overhead_by_bytes
    if not curve:
        return probes.layer_overhead_us
    return linear_interpolate(curve, layer_bytes)


def cpu_calibration(calibration: Calibration, entry: CpuEntry, threads: int, rows: float,
                    layer_bytes: float) -> Calibration:
    """The calibration with the layer, MoE and step overheads measured at this thread count (the layer's for
    a rank's `layer_bytes` of each layer) and the weight-product cost at `rows` rows (a file without a
    per-thread `step_overhead_us`, MoE overheads or `matmul_call_us`, from before they were probed, keeps the
    top-level figure)."""
    probes = entry.probes(threads)
    calls = probes.matmul_call_us
    optional = {k: getattr(probes, k) for k in ("step_overhead_us", *MOE_OVERHEADS) if getattr(probes, k) is not None}
    return replace(calibration, layer_overhead_us=layer_overhead_us(probes, layer_bytes), **optional,
                   matmul_call_us=call_us(calls, rows) if calls else calibration.matmul_call_us)
