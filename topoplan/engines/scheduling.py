"""How each engine version's scheduler batches requests: what the served model (topoplan.plan.served) needs.

Three ways an engine fills a step, as data per profile (`scheduler_of`):
- "mixed": continuous batching with chunked prefill in the same step as the decodes (vLLM V1, TensorRT-LLM's
  in-flight batching): each step runs every running sequence's next token plus prompt tokens up to a token
  budget (`max_batched_tokens`), at most `max_seqs` sequences;
- "separate": continuous batching whose prefill steps run alone, the decodes waiting (vLLM 0.2's
  prefill-first scheduler, SGLang without --enable-mixed-chunk);
- "static": one batch at a time, prefilled together then decoded to the end (the bundled runner).

Kept beside the profiles (not in them) so the profiles' modules stay as they are; each number has its source
in SOURCES, keyed like Engine.sources.
"""

from __future__ import annotations

from dataclasses import dataclass

from topoplan.engines.engine import Engine

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

    def budget(self, gpu: str, memory_bytes: float) -> Budget:
        """The defaults the engine picks on this GPU (catalog name, memory); unbounded where it sets none."""
        for b in self.budgets:
            if memory_bytes >= b.min_memory_gib * GIB and not any(word in gpu for word in b.excludes):
                return b
        return Budget(0, None, None)


STATIC = Scheduler("static")
VLLM_V1 = Scheduler("mixed", (Budget(70, 8192, 1024, excludes=("a100",)), Budget(0, 2048, 256)))
VLLM_V0_2 = Scheduler("separate", (Budget(0, 2560, 256),))
SGLANG = Scheduler("separate", (Budget(160, 16384, None), Budget(35, 8192, None), Budget(0, 2048, None)))
TRTLLM = Scheduler("mixed", (Budget(0, 8192, 2048),))

SCHEDULERS: dict[str, Scheduler] = {
    "topoplan@0.1": STATIC, "vllm@0.2": VLLM_V0_2, "vllm@0.32": VLLM_V1, "sglang@0.5": SGLANG, "trtllm@1.0": TRTLLM,
}

SOURCES: dict[str, str] = {
    "topoplan@0.1": "topoplan.runner generates one batch: all prompts prefilled together, then decoded together",
    "vllm@0.2": "vllm/core/scheduler.py (v0.2.x): waiting prompts are scheduled in a prefill-only step before any "
                "decode step; vllm/config.py SchedulerConfig max_num_batched_tokens = max(max_model_len, 2560) "
                "(2560 for prompts that fit it), max_num_seqs = 256",
    "vllm@0.32": "vllm/v1/core/sched/scheduler.py: running requests' decodes first, then waiting prompts "
                 "chunked into the rest of the token budget (chunked prefill always on in V1); "
                 "vllm/engine/arg_utils.py EngineArgs.get_batch_defaults, `vllm serve`: "
                 "max_num_batched_tokens 8192 and max_num_seqs 1024 on GPUs of >= 70 GiB other than A100 "
                 "(PR #17885), else 2048 and 256",
    "sglang@0.5": "python/sglang/srt/managers/scheduler.py: a prefill batch runs before the running decode batch "
                  "resumes (enable_mixed_chunk off by default); python/sglang/srt/server_args.py "
                  "chunked_prefill_size 2048 under 35 GiB, 8192 under 160 GiB, 16384 above; max_running_requests "
                  "from the KV pool",
    "trtllm@1.0": "TensorRT-LLM in-flight batching: context and generation requests in one iteration "
                  "(docs/source/advanced/gpt-attention.md); tensorrt_llm/builder.py BuildConfig max_num_tokens "
                  "8192, max_batch_size 2048",
}


def scheduler_of(profile: Engine) -> Scheduler:
    """The scheduler of a profile; static batching for one this table does not know (no continuous
    batching assumed)."""
    return SCHEDULERS.get(str(profile), STATIC)
