"""`topoplan run --compile`: the stage's forward under torch.compile, so a decode step is a few fused kernels
instead of hundreds of small ATen calls.

On CPU, inductor fuses the norms, rotary embedding, SwiGLU and residual adds into generated C++ loops; the
weight products stay the runner's own kernels (oneDNN's packed product is one opaque op, topoplan.runner.
cpu_linear.packed_linear). Shapes are dynamic, so one graph serves prefill and one every decode step whatever
the prompt length and step; the TP collectives are ops of the graph (topoplan.runner.dist.traced_all_reduce),
so a TP rank's layers fuse as one rank's do. On this project's 2-core VM `tiny` decodes 2.3-4x faster and
`small` 4-15% (docs/runner.md), for 6-65 s of compilation at start-up (less with torch's on-disk cache warm):
which is why it is off by default. The compilation runs in a warm-up before the
timed generation (`compile_s_per_rank` in the run's JSON): two steps of the real batch with the real run's
KV-cache length (a module buffer's size is a constant to the compiler, so another length would build new
graphs), so prefill and decode timings are the compiled step's.

On a GPU the same compilation runs without CUDA graphs: the eager decode step attends over a slice of the
cache that grows by one position per step, so a CUDA graph (torch.compile's "reduce-overhead") would be
recorded again at every step. `--cuda-graphs` records the fixed-shape step of topoplan.runner.graphs instead.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import torch
from torch import nn


def compile_stage(model: nn.Module, warm_up: Callable[[], object]) -> float:
    """Compile `model.forward` in place and run `warm_up` (a short generation of the real batch) so every graph
    is built before timing starts; returns the seconds both took."""
    start = time.perf_counter()
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")  # no compile-worker pool beside the ranks
    model.forward = torch.compile(model.forward, dynamic=True)
    warm_up()
    return time.perf_counter() - start
