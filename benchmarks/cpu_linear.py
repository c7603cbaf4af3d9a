"""The runner's CPU matrix product (topoplan.runner.cpu_linear: oneDNN, weights packed once) against the
reference, torch's F.linear (MKL), on the weights of one decode step of the built-in `small` model.

Asserts nothing, exits 0. For 1 thread and every CPU, and 1, 2, 4, 8, 64 rows (a decode step of that many
sequences; 64 is a short prefill), it times both kernels interleaved over --repeat rounds and prints ms per
pass over the 8 layers' weights (367 MB fp32), the weight bytes per second, and the ratio F.linear ms /
oneDNN ms as a range over rounds (> 1: oneDNN is faster), with the load average before and after. The last
column names the faster on this machine (best rounds compared), which is what the runner picks: it times the
two on its own weights at start-up (`cpu_linear.prepack`), since the answer differs between CPUs.

    python benchmarks/cpu_linear.py              # ~2 min on 2 cores
    python benchmarks/cpu_linear.py --repeat 9
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn.functional as F

from topoplan.runner import cpu_linear
from topoplan.runner.builtin import BUILTIN

ROWS = (1, 2, 4, 8, 64)


def step_weights() -> list[torch.Tensor]:
    """`small`'s per-layer weights as the runner stacks them (qkv, o, gate+up, down), for every layer."""
    c = BUILTIN["small"]
    d, f = c["hidden_size"], c["intermediate_size"]
    kv = d * c["num_key_value_heads"] // c["num_attention_heads"]
    shapes = [(d + 2 * kv, d), (d, d), (2 * f, d), (d, f)]
    return [torch.randn(rows, cols) for _ in range(c["num_hidden_layers"]) for rows, cols in shapes]


def once_ms(fn) -> float:
    begin = time.perf_counter()
    fn()
    return (time.perf_counter() - begin) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5, help="interleaved rounds per point")
    args = parser.parse_args()
    if not cpu_linear.available():
        raise SystemExit("this torch build has no oneDNN linear ops: nothing to compare")
    weights = step_weights()
    packed = [cpu_linear.pack(w) for w in weights]
    nbytes = sum(w.numel() * w.element_size() for w in weights)
    cpus = len(os.sched_getaffinity(0))
    print(f"load average before: {os.getloadavg()[0]:.2f} ({cpus} CPUs); weights {nbytes / 1e6:.0f} MB fp32")
    print("| threads | rows | F.linear ms | oneDNN ms | oneDNN GB/s | F.linear / oneDNN | faster here |")
    print("|---|---|---|---|---|---|---|")
    for threads in sorted({1, cpus}):
        torch.set_num_threads(threads)
        for rows in ROWS:
            inputs = {cols: torch.randn(rows, cols) for cols in {w.shape[1] for w in weights}}
            mkl = lambda: [F.linear(inputs[w.shape[1]], w) for w in weights]  # noqa: E731
            dnn = lambda: [cpu_linear.linear(inputs[w.shape[1]], p) for w, p in zip(weights, packed)]  # noqa: E731
            mkl(), dnn()
            pairs = [(once_ms(mkl), once_ms(dnn)) for _ in range(args.repeat)]
            a, b = [p[0] for p in pairs], [p[1] for p in pairs]
            ratios = [x / y for x, y in pairs]
            uses = "oneDNN" if min(b) < min(a) else "F.linear"
            print(f"| {threads} | {rows} | {min(a):.1f}-{max(a):.1f} | {min(b):.1f}-{max(b):.1f} | "
                  f"{nbytes / max(b) / 1e6:.1f}-{nbytes / min(b) / 1e6:.1f} | {min(ratios):.2f}-{max(ratios):.2f} | "
                  f"{uses} |", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
