"""`topoplan bench --kv-transfer`'s request: one request's KV cache sent from a "prefill" rank to a "decode"
rank on this machine, whole and layer by layer, over shared memory and over gloo (loopback TCP), at each prompt
length. Checked once in the parent, handed to both ranks as argv.

Imports no torch: the CLI checks the request before any rank starts.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from topoplan.bench.definitions import DEFAULT_ITERS, DEFAULT_TIMEOUT_S, DEFAULT_WARMUP, human_size, parse_sizes
from topoplan.bench.machine_limits import gib, physical_memory_bytes
from topoplan.dtypes import BENCH_DTYPES
from topoplan.errors import TopoplanError
from topoplan.limits import check_count
from topoplan.models import ModelSpec, find_model
from topoplan.plan.kv_transfer import kv_bytes_per_request
from topoplan.run_options import check_common

DEFAULT_MODEL = "Llama-3.1-8B"
DEFAULT_PROMPTS = "1K:8K"  # prompt tokens: 1024 .. 8192, doubling (the sizes a P/D deployment moves per request)
PATHS = ("shm", "gloo")  # the runner's shared-memory channel between ranks of one host; gloo over loopback TCP
MODES = ("whole", "per-layer")  # one message for the whole cache; one per layer, as a layer-wise KV connector
# The link constants come from one-way transfers of these sizes (before the KV sizes, same ranks, same paths):
# the range `topoplan calibrate` sweeps on CPU (its DEFAULT_SIZES), so the KV sizes above it are held out.
FIT_SIZES = "1K:4M"
MEMORY_SHARE = 0.5  # both ranks' caches together may take at most this share of the machine's RAM


@dataclass(frozen=True)
class KvBenchRequest:
    """What `bench --kv-transfer` measures. The defaults live here; cli.py's help repeats the model's and the
    prompt lengths' without importing this module (start-up time), and tests/test_kv_transfer_bench.py checks
    that they agree."""

    model: str = DEFAULT_MODEL  # a catalog name, alias or HF config (topoplan.models.find_model)
    prompts: tuple[int, ...] = tuple(parse_sizes(DEFAULT_PROMPTS))
    dtype: str = "float32"  # the KV cache's dtype, torch's spelling as `bench --dtype` takes it
    iters: int = DEFAULT_ITERS
    warmup: int = DEFAULT_WARMUP
    timeout: float = DEFAULT_TIMEOUT_S
    calibration: str | None = None  # a `topoplan calibrate` file: also price with its CPU link constants

    def __post_init__(self) -> None:
        check_common(backend=None, dtype=self.dtype, dtypes=BENCH_DTYPES, timeout=self.timeout)
        check_count("--iters", self.iters)
        check_count("--warmup", self.warmup)
        if not self.prompts or min(self.prompts) < 1:
            raise TopoplanError(f"--prompt-len {self.prompts}: expected positive token counts")
        need, have = 2 * self.kv_bytes(max(self.prompts)), physical_memory_bytes()
        if need > MEMORY_SHARE * have:
            raise TopoplanError(f"--prompt-len {max(self.prompts)}: {self.spec.name}'s KV cache on both ranks takes "
                                f"{gib(need)}, more than half of this machine's {gib(have)}; pass shorter prompts "
                                "or a smaller --dtype")

    @classmethod
    def from_options(cls, *, prompt_len: str = DEFAULT_PROMPTS, refused: Sequence[str] = (),
                     **rest: object) -> KvBenchRequest:
        """From the command line's strings (`--prompt-len 1K:8K` doubles, `--prompt-len 1000,3000` lists);
        `refused`: the collective sweep's options the user also gave, which this mode does not take."""
        if refused:
            raise TopoplanError(f"{', '.join(refused)}: the collective sweep's option(s); --kv-transfer takes "
                                "--model, --prompt-len, --calibration, --dtype, --iters, --warmup and --timeout")
        try:
            prompts = tuple(parse_sizes(prompt_len))
        except TopoplanError:
            raise TopoplanError(f"--prompt-len {prompt_len!r}: expected token counts, LO:HI doubling (1K:8K) or a "
                                "list (1000,3000)") from None
        return cls(prompts=prompts, **rest)  # type: ignore[arg-type]

    @cached_property
    def spec(self) -> ModelSpec:
        return find_model(self.model)

    def kv_bytes(self, prompt_tokens: int) -> int:
        """The whole cache of one request, as the planner counts it (topoplan.plan.kv_transfer)."""
        return kv_bytes_per_request(self.spec, prompt_tokens, self.dtype)

    def layer_bytes(self, prompt_tokens: int) -> int:
        """One layer's share: every layer holds the same K and V per token."""
        return self.kv_bytes(prompt_tokens) // self.spec.layers

    def worker_argv(self) -> list[str]:
        """The argv of `python -m topoplan.bench.kv_worker` (what `from_worker_argv` reads)."""
        return ["--model", self.model, "--prompt-len", ",".join(human_size(p) for p in self.prompts),
                "--dtype", self.dtype, "--iters", str(self.iters), "--warmup", str(self.warmup),
                "--timeout", str(self.timeout)]

    @classmethod
    def from_worker_argv(cls, argv: Sequence[str] | None = None) -> KvBenchRequest:
        parser = argparse.ArgumentParser(prog="python -m topoplan.bench.kv_worker")
        for name in ("model", "prompt-len", "dtype", "iters", "warmup", "timeout"):
            parser.add_argument(f"--{name}", required=True)
        args = parser.parse_args(argv)
        return cls.from_options(model=args.model, prompt_len=args.prompt_len, dtype=args.dtype,
                                iters=int(args.iters), warmup=int(args.warmup), timeout=float(args.timeout))
