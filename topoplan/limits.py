"""Sizes no real machine or file reaches, so input beyond them is refused in one line instead of costing
minutes or gigabytes. docs/limits.md lists each with the largest real case it leaves room for."""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

from topoplan.cpuset import cpu_cores
from topoplan.errors import TopoplanError

# Input files: the largest real input is an NVML recording of a 72-GPU rack (~1 MB); 32 MiB is 30x that.
MAX_INPUT_BYTES = 32 * 2**20
# JSON nesting: recordings and calibrations nest 4-6 deep; HF configs 3-4 (rope_scaling, quantization_config).
MAX_JSON_DEPTH = 64
# Digits in any integer read from text: 20 hold every count, size, id and 64-bit mask a machine reports (uint64).
MAX_DIGITS = 20
# One node: the largest single-OS-image GPU machines hold 16 GPUs (HGX-2, DGX-2) or 20 single-slot PCIe cards;
# NICs a few dozen. Placement search grows with the cube of GPUs per node: 32 plans in seconds.
MAX_GPUS_PER_NODE = 32
MAX_NICS_PER_NODE = 128
# Clusters: one inference deployment spans at most a few hundred nodes; 4,096 nodes x 8 GPUs (32k GPUs) is
# beyond any published one and still plans in seconds.
MAX_NODES = 4_096
# Processes one `run`/`bench` may start on this machine: each local rank is a whole Python process with torch
# loaded (~0.3 GB, seconds to start); beyond a few per CPU they only time-slice, and thousands would exhaust
# memory before measuring anything.
RANKS_PER_CPU = 8


def max_local_ranks() -> int:
    """The most ranks started on this machine (see RANKS_PER_CPU)."""
    return RANKS_PER_CPU * len(cpu_cores())


def read_capped(path: str | Path, stream: BinaryIO | None = None, cap: int = MAX_INPUT_BYTES) -> bytes:
    """At most `cap` bytes of `path` (or of `stream`, e.g. stdin): a larger input (or an endless one such as
    /dev/zero) is refused after reading cap+1 bytes, never loaded whole."""
    if stream is not None:
        data = stream.read(cap + 1)
    else:
        with open(path, "rb") as handle:
            data = handle.read(cap + 1)
    if len(data) > cap:
        raise TopoplanError(f"larger than {cap // 2**20} MiB, the most topoplan reads from one input file; "
                            f"expected a topology, recording, config or calibration file", source=str(path))
    return data



# Count options: (least, most) per option. The most is far above any real use, so a slip (a few extra zeros) is
# refused in one line instead of running for days or sizing a KV cache for a billion tokens:
# - --iters, --warmup (bench, calibrate): nccl-tests' default is 20 timed and 5 untimed operations; 100,000 x the
#   smallest collective is minutes already.
# - --repeats (validate): the median of 3; 100 runs per layout is hours with the `small` model.
# - --max-new-tokens (run), --gen-len, --prompt-len (plan, validate): the longest context of a released model is
#   10M tokens (Llama 4 Scout); 2**24 leaves room for it.
# - --batch (plan, validate): served batches are hundreds to a few thousand sequences per replica.
# - --micro-batches (run): at most one per sequence is useful; 4,096 covers any batch `run` takes.
COUNT_OPTIONS: dict[str, tuple[int, int]] = {
    "--iters": (1, 100_000),
    "--warmup": (0, 100_000),
    "--repeats": (1, 100),
    "--max-new-tokens": (1, 2**24),
    "--gen-len": (1, 2**24),
    "--prompt-len": (1, 2**24),
    "--batch": (1, 1_048_576),
    "--micro-batches": (0, 4_096),
}


def check_count(option: str, value: int) -> int:
    """`value` of count option `option` if within COUNT_OPTIONS' bounds, else a one-line TopoplanError."""
    least, most = COUNT_OPTIONS[option]
    if not least <= value <= most:
        raise TopoplanError(f"{option} {value}: expected {least} to {most:,}")
    return value
