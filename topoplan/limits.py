"""Sizes no real machine or file reaches, so input beyond them is refused in one line instead of costing
minutes or gigabytes. Every reader (text pastes, NVML recordings, NCCL XML, AMD text, HF configs, calibration
files) counts against the same limits, before it allocates. `LIMITS` is the table docs/limits.md shows, each with
the largest real case it leaves room for (tests/test_limits_doc.py checks the two agree)."""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from topoplan.cpuset import cpu_cores
from topoplan.errors import TopoplanError

# Input files: the largest real input is an NVML recording of a 72-GPU rack (~1 MB); 32 MiB is 30x that.
MAX_INPUT_BYTES = 32 * 2**20
# Nesting (JSON and XML): recordings and calibrations nest 4-6 deep; HF configs 3-4 (rope_scaling,
# quantization_config); an NCCL topology dump 6-10 (system > cpu > PCIe switch levels > pci > gpu > nvlink).
MAX_DEPTH = 64
# Elements in one file (JSON values, XML elements): the 8-GPU HGX H100 recording holds 1,412 JSON values (a 32-GPU
# node, with 496 GPU pairs, ~15,000), an 8-GPU, 8-NIC NCCL dump 83 elements. Beyond this, parsing alone costs
# seconds and hundreds of MiB.
MAX_ELEMENTS = 100_000
# Non-blank lines in a text paste (`topo -m`, `topo -p2p`, rocm-smi, amd-smi): the bundled pastes have at most 54
# (an 8-GPU, 18-NIC `topo -m`), rocm-smi/amd-smi of 8 GPUs 50; a 32-GPU, 128-NIC node stays in the hundreds. Runs of
# blank lines count as one.
MAX_LINES = 20_000
# Characters of a paste once its tabs are expanded to 8-column stops (a tab may become 8 spaces): the widest real
# row, 32 GPUs and 128 NICs, is ~1,500 columns. Counted before each line is expanded.
MAX_TEXT_COLUMNS = 16 * 2**20
# Digits in any integer read from text: 20 hold every count, size, id and 64-bit mask a machine reports (uint64).
MAX_DIGITS = 20
# One node: the largest single-OS-image GPU machines hold 16 GPUs (HGX-2, DGX-2) or 20 single-slot PCIe cards;
# NICs a few dozen. Placement search grows with the cube of GPUs per node: 32 plans in seconds.
MAX_GPUS_PER_NODE = 32
MAX_NICS_PER_NODE = 128
# NUMA node numbers: Linux holds at most 1,024 nodes (CONFIG_NODES_SHIFT <= 10); a larger one reaching a numactl
# line would only fail there.
MAX_NUMA_NODE = 1023
# Model depth: the deepest published LLMs have ~130 layers (Llama 3.1 405B: 126). The planner's work grows with
# layers times nodes: a 2,048-layer, 256-expert MoE planned for 64 nodes took 4.8 s on the 2-core VM, a 128-layer
# one for 4,096 nodes 62 s; 10^9 layers (allowed before) never ended.
MAX_LAYERS = 1_024
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


@dataclass(frozen=True)
class Limit:
    """One row of docs/limits.md's table."""

    what: str
    value: str
    room: str  # the largest real case it leaves room for

    def row(self) -> str:
        return f"| {self.what} | {self.value} | {self.room} |"


LIMITS = (
    Limit("One input file (paste, recording, config, calibration)",
          f"{MAX_INPUT_BYTES >> 20} MiB, read in one bounded read; a regular file or stdin (`-`)",
          "an NVML recording of a 72-GPU rack is ~1 MB"),
    Limit("Nesting (JSON and XML)", f"{MAX_DEPTH} levels", "recordings nest 4–6 deep, HF configs 3–4, NCCL XML 6–10"),
    Limit("Elements in one file (JSON values, XML elements)", f"{MAX_ELEMENTS:,}",
          "1,412 values in an 8-GPU HGX H100 recording"),
    Limit("Non-blank lines in a text paste", f"{MAX_LINES:,} (a run of blank lines counts once)",
          "54 in the bundled pastes (8 GPUs, 18 NICs)"),
    Limit("A paste with its tabs expanded", f"{MAX_TEXT_COLUMNS >> 20} Mi characters",
          "6,861 in the largest bundled paste"),
    Limit("Digits in one integer (text, JSON or XML, hex too)", f"{MAX_DIGITS}",
          "a 64-bit CPU-affinity mask word (uint64)"),
    Limit("GPUs per node (every format)", f"{MAX_GPUS_PER_NODE}", "16 (DGX-2/HGX-2) or 20 single-slot PCIe cards"),
    Limit("NICs per node (every format)", f"{MAX_NICS_PER_NODE}", "a few dozen (18 on an OCI BM.GPU4)"),
    Limit("NUMA node number", f"0 to {MAX_NUMA_NODE}", "Linux's own maximum of 1,024 nodes"),
    Limit("Ranges in one CPU list", "one per CPU (65,536); repeats merged, never expanded one by one",
          "a few dozen in a sysfs `cpulist`"),
    Limit("Layers in an HF config", f"{MAX_LAYERS:,}", "126 (Llama 3.1 405B)"),
)


def read_capped(path: str | Path, stream: BinaryIO | None = None, cap: int = MAX_INPUT_BYTES) -> bytes:
    """At most `cap` bytes of `path` (or of `stream`, e.g. stdin): a larger input is refused after reading cap+1
    bytes, never loaded whole. A path must name a regular file: a FIFO would block forever and a device
    (/dev/zero) never ends, so both are refused before reading (opened without blocking, checked on the open
    file so nothing can swap it in between); stdin is the way to pipe input in."""
    if stream is not None:
        data = stream.read(cap + 1)
    else:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as handle:
            mode = os.fstat(fd).st_mode
            if stat.S_ISDIR(mode):
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
            if not stat.S_ISREG(mode):
                raise TopoplanError(f"{_kind(mode)}, not a regular file; expected a topology, recording, config or "
                                    "calibration file (pipe input through stdin, `-`)", source=str(path))
            data = _read_sized(handle, os.fstat(fd).st_size, cap)
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
# - --kv-cache-gib (launch --device cpu): vLLM's CPU KV cache; 64 TiB is beyond any host's memory.
COUNT_OPTIONS: dict[str, tuple[int, int]] = {
    "--iters": (1, 100_000),
    "--warmup": (0, 100_000),
    "--repeats": (1, 100),
    "--max-new-tokens": (1, 2**24),
    "--gen-len": (1, 2**24),
    "--prompt-len": (1, 2**24),
    "--batch": (1, 1_048_576),
    "--micro-batches": (0, 4_096),
    "--kv-cache-gib": (1, 65_536),
}


def check_count(option: str, value: int) -> int:
    """`value` of count option `option` if within COUNT_OPTIONS' bounds, else a one-line TopoplanError."""
    least, most = COUNT_OPTIONS[option]
    if not least <= value <= most:
        raise TopoplanError(f"{option} {value}: expected {least} to {most:,}")
    return value


def _read_sized(handle: BinaryIO, size: int, cap: int) -> bytes:
    """At most cap+1 bytes of a regular file, allocating what it holds rather than the cap up front: its size
    first, then 1 MiB at a time for files whose size says nothing (procfs and sysfs report 0 or 4096)."""
    want = min(size, cap) + 1
    chunks = [handle.read(want)]
    total = len(chunks[0])
    if total < want:  # fewer bytes than asked: the end of the file
        return chunks[0]
    while total <= cap and (chunk := handle.read(min(1 << 20, cap + 1 - total))):
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


def _kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    kinds = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "a special file")


def whole_number(text: str, what: str, *, source: str | Path | None = None, line: int | None = None,
                 base: int = 10) -> int:
    """`text` (decimal digits, or hex without its `0x` when base is 16) as an int, refusing more than MAX_DIGITS
    digits before converting: Python's int() of a 5,000-digit string raises, and a 20-digit one already exceeds
    any count a machine reports."""
    digits = text.lstrip("-")
    if len(digits) > MAX_DIGITS:
        raise TopoplanError(f"{what}: a number with {len(digits)} digits; expected at most {MAX_DIGITS}",
                            source=source, line=line)
    return int(text, base)
