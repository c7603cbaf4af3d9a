"""How each engine version's scheduler batches requests: what the served model (topoplan.plan.served) needs.

Three ways an engine fills a step, as data on each Engine (`Engine.scheduler`, set in the engine's own module with
the source of its budgets under `sources["scheduler.budgets"]`):
- "mixed": continuous batching with chunked prefill in the same step as the decodes (vLLM V1, TensorRT-LLM's
  in-flight batching): each step runs every running sequence's next token plus prompt tokens up to a token
  budget (`max_batched_tokens`), at most `max_seqs` sequences;
- "separate": continuous batching whose prefill steps run alone, the decodes waiting (vLLM 0.2's
  prefill-first scheduler, SGLang without --enable-mixed-chunk);
- "static": one batch at a time, prefilled together then decoded to the end (the bundled runner).
A `ttft_factor` is an empirical correction, not a mechanism: set only on a profile whose measured TTFT no
modelled mechanism explains (vLLM V1, TensorRT-LLM), fitted on that profile's own fitting rows
(docs/planner.md, section 4).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GIB = 2**30


@dataclass(frozen=True)
class Budget:
    """The scheduler's defaults on GPUs of at least `min_memory_gib` (and, with `excludes`, whose catalog
    name contains none of those words): tokens per step and sequences running at once."""

    min_memory_gib: float
    max_batched_tokens: int | None  # None: no token budget
    max_seqs: int | None  # None: no limit beyond memory
    excludes: tuple[str, ...] = ()


@dataclass(frozen=True)
class TtftFactor:
    """aiconfigurator's documented TTFT "queuing factor" form, 1 + log2(C) / divisor, flat from C =
    `saturates_at` on (aiconfigurator_core/sdk/backends/vllm_backend.py, _ttft_queuing_factor: divisor 8,
    saturating at 256): a multiplier on the modelled TTFT at C requests in flight, with `divisor` fitted by
    benchmarks/engine_fit.py on the profile's fitting rows (those whose measured TTFT does not grow with the
    output length). Empirical: it stands for a wait no modelled mechanism explains."""

    divisor: float
    saturates_at: int = 256

    def at(self, concurrency: int) -> float:
        return 1.0 + math.log2(min(max(concurrency, 1), self.saturates_at)) / self.divisor


@dataclass(frozen=True)
class Scheduler:
    """One engine version's batching: its mode and its budgets by GPU, largest first."""

    mode: str  # "mixed" | "separate" | "static"
    budgets: tuple[Budget, ...] = ()
    ttft_factor: TtftFactor | None = None  # "mixed": empirical TTFT multiplier (sources["scheduler.ttft_factor.*"])

    def budget(self, gpu: str, memory_bytes: float) -> Budget:
        """The defaults the engine picks on this GPU (catalog name, memory); unbounded where it sets none."""
        for b in self.budgets:
            if memory_bytes >= b.min_memory_gib * GIB and not any(word in gpu for word in b.excludes):
                return b
        return Budget(0, None, None)


STATIC = Scheduler("static")  # one batch at a time: what an engine that names no scheduler is priced with
