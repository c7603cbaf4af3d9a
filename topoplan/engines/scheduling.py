"""How each engine version's scheduler batches requests: what the served model (topoplan.plan.served) needs.

Three ways an engine fills a step, as data on each Engine (`Engine.scheduler`, set in the engine's own module with
the source of its budgets under `sources["scheduler.budgets"]`):
- "mixed": continuous batching with chunked prefill in the same step as the decodes (vLLM V1, TensorRT-LLM's
  in-flight batching): each step runs every running sequence's next token plus prompt tokens up to a token
  budget (`max_batched_tokens`), at most `max_seqs` sequences;
- "separate": continuous batching whose prefill steps run alone, the decodes waiting (vLLM 0.2's
  prefill-first scheduler, SGLang without --enable-mixed-chunk);
- "static": one batch at a time, prefilled together then decoded to the end (the bundled runner).
A "mixed" engine with `waves` (TensorRT-LLM) keeps a closed loop's requests in waves: the C that arrive
together are packed into steps first come first served, and TTFT is the wave's mean (served.wave_ttft).
"""

from __future__ import annotations

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
class Scheduler:
    """One engine version's batching: its mode and its budgets by GPU, largest first."""

    mode: str  # "mixed" | "separate" | "static"
    budgets: tuple[Budget, ...] = ()
    waves: bool = False  # "mixed": a closed loop's requests reach it in waves (topoplan.plan.served.wave_ttft)

    def budget(self, gpu: str, memory_bytes: float) -> Budget:
        """The defaults the engine picks on this GPU (catalog name, memory); unbounded where it sets none."""
        for b in self.budgets:
            if memory_bytes >= b.min_memory_gib * GIB and not any(word in gpu for word in b.excludes):
                return b
        return Budget(0, None, None)


STATIC = Scheduler("static")  # one batch at a time: what an engine that names no scheduler is priced with
