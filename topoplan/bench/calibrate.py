"""`topoplan calibrate`: measure this machine and write the calibration file the planner reads.

1. a short all_reduce + all_to_all + sendrecv sweep over each link class present (on CPU: gloo between processes, one
   per core; on GPUs: one pair of GPUs per `topo -m` link class, NCCL); on CPU also what a collective waits
   inside a step beyond its back-to-back time (topoplan.bench.sync_wait), added to `collective_base_us`;
2. probes with the dtype in use: memory bandwidth, GEMV, GEMM, and the runner's per-layer and per-step
   fixed overheads;
3. least-squares alpha/beta per link class and group size (topoplan.bench.fit), turned into the planner's
   constants (topoplan.plan.calibration), plus on CPU the `cpu` hardware entry (topoplan.plan.cpu_entry).
docs/bench.md describes the file and how each figure is used.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from topoplan import __version__
from topoplan.bench import probes
from topoplan.bench.definitions import parse_sizes
from topoplan.bench.fit import CollectiveFit, fit_sweep, link_constants
from topoplan.bench.launch import spawn_json
from topoplan.bench.load import LoadMonitor, Sources
from topoplan.bench.machine_limits import gib, physical_memory_bytes
from topoplan.bench.request import BenchRequest
from topoplan.cpuset import cpu_cores
from topoplan.dtypes import PROBE_DTYPES, checked_dtype, dtype_of
from topoplan.errors import TopoplanError
from topoplan.limits import check_count
from topoplan.plan.calibration import Calibration, LinkCalibration
from topoplan.plan.calibration_file import (
    CalibrationFile,
    ConstantValues,
    CpuEntry,
    GpuRecord,
    LinkValues,
    Measured,
    parse_cpu_entry,
)
from topoplan.plan.cpu_entry import CPU_LINK, MOE_OVERHEADS
from topoplan.runner.dist import gpu_vendor
from topoplan.topology.links import parse_link_code

# the runner's fixed costs the probes measure, each a Calibration field of the same name
RUNNER_OVERHEADS = ("layer_overhead_us", "step_overhead_us", *MOE_OVERHEADS)
SWEEP_OPS = "all_reduce,all_to_all,sendrecv"  # what the planner prices: TP all-reduces, MoE all-to-alls, hand-offs
DEFAULT_SIZES = "1K:4M"  # decode's all-reduces are KB-sized, prefill's up to MBs: the range the planner prices


def sweep_link(ranks: int, link_class: str, sizes: str, iters: int, warmup: int, backend: str | None,
               env: dict[str, str] | None = None) -> list[CollectiveFit]:
    request = BenchRequest.from_options(ops=SWEEP_OPS, sizes=sizes, iters=iters, warmup=warmup,
                                        backend=backend, shared_memory=True)  # as the runner's TP/EP groups and stages
    result = spawn_json(ranks, "topoplan.bench.sweep_worker", request.worker_argv(),
                        echo=False, what=f"calibration sweep ({link_class}, {ranks} ranks)",
                        extra_env=env)
    return fit_sweep(result["results"], link_class, ranks)


def probe_all(device: torch.device, dtype: str, probe_mib: int) -> dict[str, Any]:
    """Every probe's figure, and under "spread" each probe's worst interquartile spread / median (probes.py)."""
    torch_dtype, nbytes = dtype_of(dtype).torch(), probe_mib * probes.MiB
    noise: dict[str, list[float]] = {name: [] for name in ("overheads", "stream", "gemv", "gemm", "matmul", "call",
                                                           "streamed")}
    per_layer, per_step = probes.runner_overheads_us(device, torch_dtype, noise=noise["overheads"])
    per_moe_layer, per_expert = probes.moe_overheads_us(device, torch_dtype, per_layer, noise=noise["overheads"])
    figures = {"stream_gbps": probes.stream_gbps(device, nbytes, noise=noise["stream"]),
               "gemv_gbps": probes.gemv_gbps(device, torch_dtype, nbytes, noise=noise["gemv"]),
               "gemm_tflops": probes.gemm_tflops(device, torch_dtype, noise=noise["gemm"]),
               "layer_overhead_us": per_layer,
               "step_overhead_us": per_step,
               "moe_layer_overhead_us": per_moe_layer,
               "expert_overhead_us": per_expert}
    matmul_bytes = min(nbytes, 64 * probes.MiB)
    if device.type == "cpu" and torch_dtype == torch.float32:  # the runner's CPU dtype, where it picks a kernel
        by_kernel = probes.matmul_tflops_by_kernel(nbytes=matmul_bytes, noise=noise["matmul"])
        figures["matmul_tflops_by_kernel"] = by_kernel
        figures["matmul_tflops"] = {m: max(curve[m] for curve in by_kernel.values()) for m in by_kernel["mkl"]}
    else:
        figures["matmul_tflops"] = probes.matmul_tflops(device, torch_dtype, nbytes=matmul_bytes,
                                                        noise=noise["matmul"])
    if device.type == "cpu":  # a GPU's per-kernel launch is in layer_overhead_us already (its probe times them)
        figures["matmul_call_us"] = {str(rows): probes.matmul_call_us(device, torch_dtype, rows, noise=noise["call"])
                                     for rows in probes.CALL_ROWS}
        streamed = probes.streamed_layer_overhead_us(device, torch_dtype, noise=noise["streamed"])
        cached_bytes, streamed_bytes = (probes.layer_bytes(shape, torch_dtype)
                                        for shape in (probes.PROBE_MODEL, probes.STREAMED_PROBE_MODEL))
        figures["layer_overhead_by_bytes"] = {str(cached_bytes): per_layer, str(streamed_bytes): streamed}
    return figures | {"spread": {name: round(max(values), 3) for name, values in noise.items() if values}}


def cpu_entry(dtype: str, probe_mib: int, monitor: LoadMonitor, step: Step) -> CpuEntry:
    """Probes at one thread and at every core (topoplan.plan.cpu_entry explains how the planner uses them)."""
    cores, before = len(cpu_cores()), torch.get_num_threads()
    threads = {}
    try:
        for count in sorted({1, cores}):
            torch.set_num_threads(count)
            label = f"the probes at {count} thread(s)"
            step(label)
            with monitor.window(label):
                threads[str(count)] = probe_all(torch.device("cpu"), dtype, probe_mib)
    finally:
        torch.set_num_threads(before)
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return parse_cpu_entry({"cores": cores, "numa_nodes": 1, "memory_bytes": memory, "dtype": dtype,
                            "threads": threads}, "<calibration>")


def gpu_pairs_by_class(topo: str | None) -> dict[str, tuple[int, int]]:
    """One GPU pair per link class present (the first in index order)."""
    from topoplan.machine import load_topology

    topology = load_topology(topo, None)
    pairs: dict[str, tuple[int, int]] = {}
    for link in topology.links():
        if link.a.startswith("GPU") and link.b.startswith("GPU"):
            pairs.setdefault(link.kind.value, (topology.gpu(link.a).index, topology.gpu(link.b).index))
    return pairs


PROBE_COPIES = 3  # the GEMV probe holds an fp32 random matrix and its --dtype copy: up to 3x the buffer at once


def check_probe_mib(probe_mib: int) -> None:
    """Refuse a probe buffer that cannot fit: PROBE_COPIES of it must stay within half of this machine's RAM."""
    if probe_mib < 1:
        raise TopoplanError(f"--probe-mib must be at least 1, got {probe_mib}")
    need, have = PROBE_COPIES * probe_mib * probes.MiB, physical_memory_bytes()
    if need > have // 2:
        raise TopoplanError(f"--probe-mib {probe_mib}: the probes hold {PROBE_COPIES}x it ({gib(need)}), more than "
                            f"half of this machine's {gib(have)} of memory; expected at most "
                            f"{have // 2 // PROBE_COPIES // probes.MiB}")


Step = Callable[[str], None]  # called with what starts next (a progress bar's label)


def calibrate(*, sizes: str = DEFAULT_SIZES, iters: int = 20, warmup: int = 5, dtype: str | None = None,
              topo: str | None = None, probe_mib: int = 256, force: bool = False, sources: Sources | None = None,
              on_step: Callable[[str, int, int], None] | None = None) -> CalibrationFile:
    """Measure and fit; returns the calibration file (topoplan.plan.calibration_file writes it).

    A busy machine (topoplan.bench.load) is refused before measuring, and a measurement that other processes
    disturbed is refused after it, unless `force`; then the file records the warnings. `on_step(label, done,
    total)` reports progress."""
    parse_sizes(sizes)
    check_count("--iters", iters)
    check_count("--warmup", warmup)
    check_probe_mib(probe_mib)
    gpu = torch.cuda.is_available()
    dtype = dtype or ("bf16" if gpu else "fp32")
    checked_dtype(dtype, PROBE_DTYPES)
    # the pairs are read before measuring: a bad --topo fails fast
    pairs = gpu_pairs_by_class(topo) if topo is not None or (gpu and torch.cuda.device_count() >= 2) else {}
    if topo is not None and not gpu:
        raise TopoplanError(f"--topo {topo}: names GPU link classes, but torch sees no GPU here (on CPU the "
                            "sweep runs between processes; drop --topo)")
    monitor = LoadMonitor("calibrate", sources or Sources())
    monitor.check_quiet(force)
    cores = len(cpu_cores())
    if gpu:
        total = (len(pairs) if torch.cuda.device_count() >= 2 else 0) + 1  # a sweep per link class, the probes
    else:
        # sweeps at 2 and all cores, the synchronisation probe, the probes
        total = (len({2, cores}) + 1 if cores >= 2 else 0) + len({1, cores})
    done = [0]

    def step(label: str) -> None:
        if on_step:
            on_step(label, done[0], total)
        done[0] += 1

    started = time.time()
    fits: list[CollectiveFit] = []
    cal = Calibration()
    gpu_record: GpuRecord | None = None
    cpu: CpuEntry | None = None
    waits: dict[str, float] = {}  # the synchronisation probe's (CPU): stretch MiB -> us
    if gpu:
        from topoplan.hardware import lookup_gpu

        count = torch.cuda.device_count()
        if count >= 2:
            for link_class, (a, b) in pairs.items():
                label = f"the {link_class} sweep"
                step(label)
                with monitor.window(label):
                    fits += sweep_link(2, link_class, sizes, iters, warmup, "nccl",
                                       {gpu_vendor().visible_devices: f"{a},{b}"})
        step("the GPU probes")
        with monitor.window("the GPU probes"):
            measured = probe_all(torch.device("cuda"), dtype, probe_mib)
        name = torch.cuda.get_device_name(0)
        spec = lookup_gpu(name)
        gpu_record = GpuRecord(name, spec.key if spec else None, measured)
        if spec is not None:  # efficiencies are against the catalog's peaks
            peak_tflops = spec.bf16_tflops if dtype in ("bf16", "fp16") else spec.bf16_tflops / 2
            cal = replace(cal, memory_bandwidth_efficiency=min(1.0, measured["gemv_gbps"] / spec.memory_bandwidth_gbps),
                          flop_efficiency=min(1.0, measured["gemm_tflops"] / peak_tflops))
        cal = replace(cal, **{k: measured[k] for k in RUNNER_OVERHEADS})
    else:
        link_class = parse_link_code(CPU_LINK)[1].value
        for ranks in sorted({2, cores}) if cores >= 2 else []:
            label = f"the {ranks}-rank sweep"
            step(label)
            with monitor.window(label):
                fits += sweep_link(ranks, link_class, sizes, iters, warmup, "gloo")
        if cores >= 2:
            step("the synchronisation probe")
            with monitor.window("the synchronisation probe"):
                waits = spawn_json(cores, "topoplan.bench.sync_wait", [], echo=False,
                                   what="synchronisation probe")["wait_us"]
        cpu = cpu_entry(dtype, probe_mib, monitor, step)
        socket = cpu.probes(cpu.cores)
        # A CPU device's bandwidth and FLOP/s *are* the measured GEMV and GEMM rates (topoplan.plan.cpu_entry):
        # there is no vendor peak to take a fraction of, so both efficiencies are 1.
        cal = replace(cal, memory_bandwidth_efficiency=1.0, flop_efficiency=1.0,
                      matmul_call_us=dict(socket.matmul_call_us or ())[1],
                      **{k: getattr(socket, k) for k in RUNNER_OVERHEADS})
    constants = link_constants(fits, cal.collective_base_us)
    links = dict(cal.links)
    for link_class, alpha in constants.alpha_us.items():
        links[link_class] = LinkCalibration(alpha, constants.bandwidth_gbps.get(link_class))
    cal = replace(cal, links=links, collective_base_us=constants.base_us if constants.base_us is not None
                  else cal.collective_base_us)
    if waits:  # the base is "launch, enqueue, rank skew": the back-to-back sweep's fit holds no skew
        cal = replace(cal, collective_base_us=cal.collective_base_us + statistics.median(waits.values()))
    if on_step:
        on_step("done", total, total)
    if monitor.busy and not force:
        more = len(monitor.warnings) - 1
        raise TopoplanError(f"{monitor.warnings[0]}{f' (and {more} more step(s))' if more else ''}; the calibration "
                            "was not written: run it again on a quiet machine, or pass --force to write it anyway")
    measured_record = Measured(
        host=platform.node(), when=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        seconds=round(time.time() - started, 1), load_average=list(os.getloadavg()), load=monitor.report(),
        topoplan=__version__, torch=torch.__version__, dtype=dtype, sizes=sizes, iters=iters, probe_mib=probe_mib,
        base_from_fit=constants.base_us is not None, sync_wait_us=waits, fits=[f.to_json() for f in fits])
    return CalibrationFile(links={k: LinkValues(c.alpha_us, c.bandwidth_gbps) for k, c in cal.links.items()},
                           constants=ConstantValues.of(cal), gpu=gpu_record, cpu=cpu, measured=measured_record)
