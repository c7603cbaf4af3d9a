"""How much of its doubled peak an fp8 GEMM gets in each engine's measured kernels: a price tested and not kept.

A GPU's dense fp8 peak is twice its bf16 peak (Hopper, Blackwell), and the cost model prices a GEMM at
peak x `flop_efficiency` in its compute dtype: an fp8 prefill's GEMMs at twice a bf16 one's speed. The engines'
measured GEMM kernels do not double: aiconfigurator's per-engine `gemm_perf` tables (its silicon data, the
optional extra) time the same shapes in bf16 and in per-tensor fp8. At prefill sizes (m 1,024-8,192 rows, n and
k of 4,096 or more) this prints, per engine and datacenter GPU, the median over shapes of bf16 time / fp8 time
(the fp8 speedup) and half of it: the share of flop_efficiency an fp8 GEMM would get, and each engine's median
over those GPUs. Priced so, served TPOT moved closer on TensorRT-LLM's Qwen3-32B fp8 runs at 32-128 in flight
and further off on the unseen Llama-3.1-70B fp8 runs of vLLM and TensorRT-LLM (docs/planner.md section 6), so
the cost model does not carry it.

    python benchmarks/fp8_gemm_ratio.py   # needs pip install 'topoplan[aiconfigurator]'
"""

from __future__ import annotations

import importlib.resources
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from topoplan.engines.engine import version_tuple  # noqa: E402

GPUS = ("h100_sxm", "h200_sxm", "b200_sxm", "gb200", "b300_sxm", "gb300")  # Hopper and Blackwell datacenter parts
ENGINES = ("vllm", "sglang", "trtllm")
PEAK_RATIO = 2.0  # dense fp8 / bf16 tensor peak on these GPUs


def speedups(table) -> list[float]:
    """bf16 time / fp8 time for each prefill-sized shape both dtypes were timed at."""
    d = table[(table.m >= 1024) & (table.m <= 8192) & (table.n >= 4096) & (table.k >= 4096)]
    by = d.pivot_table(index=["m", "n", "k"], columns="gemm_dtype", values="latency", aggfunc="min")
    if "bfloat16" not in by or "fp8" not in by:
        return []
    return list((by["bfloat16"] / by["fp8"]).dropna())


def main() -> None:
    try:
        import pandas as pd
        data = importlib.resources.files("aiconfigurator_core").joinpath("systems/data")
    except ModuleNotFoundError:
        sys.exit("fp8_gemm_ratio: needs the optional extra: pip install 'topoplan[aiconfigurator]'")
    print("| engine | GPU | version | shapes | fp8 speedup (median) | fp8 share of flop_efficiency |\n"
          "|---|---|---|---|---|---|")
    for engine in ENGINES:
        ratios = []
        for gpu in GPUS:
            folder = data.joinpath(gpu, "gemm", engine)
            if not folder.is_dir():
                continue
            version = max((v.name for v in folder.iterdir() if v.joinpath("gemm_perf.parquet").is_file()),
                          key=lambda name: version_tuple(name) or ())
            found = speedups(pd.read_parquet(str(folder.joinpath(version, "gemm_perf.parquet"))))
            if found:
                median = statistics.median(found)
                ratios.append(median / PEAK_RATIO)
                print(f"| {engine} | {gpu} | {version} | {len(found)} | {median:.2f} | {median / PEAK_RATIO:.2f} |")
        if ratios:
            print(f"| {engine} | median over the GPUs | | | | **{statistics.median(ratios):.2f}** |")


if __name__ == "__main__":
    main()
