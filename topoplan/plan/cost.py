"""The cost model: memory per GPU, prefill time (TTFT), decode time per token (TPOT), throughput.

Each formula is in docs/planner.md with its source. Per pipeline stage:
    memory  = weights/tp + batch x (prompt + generated) x KV bytes per token of its layers (per TP rank)
    prefill = max(FLOPs / (peak x flop_eff), weight bytes / (HBM x mem_eff)) + layers x overhead
              + 2 all-reduces per layer of batch x prompt x hidden x bytes
    decode  = max(FLOPs / (peak x flop_eff), (weights read + KV read) / (HBM x mem_eff))
              + layers x overhead + 2 all-reduces per layer of batch x hidden x bytes
    (overhead per layer: layer_overhead_us, or decode_layer_overhead_us in decode under CUDA graphs; both
    phases add matmul_call_us per weight product streamed from memory, StageModel.streamed_products, and
    per MoE layer moe_layer_overhead_us plus expert_overhead_us per routed expert the rank runs)
    with TP, the first stage's vocab-parallel embedding adds one all-reduce of its output and the last
    stage's vocab-parallel LM head one all-gather of batch x vocab logits (vLLM, Megatron-LM).
A step crosses all stages in series plus p-1 hand-offs, and with p > 1 the sampled token ids go back from
the last stage to the first (which embeds them next step); each step also pays `step_overhead_us` outside
the layers, plus `step_overhead_per_rank_us` per rank beyond the first (an engine whose driver feeds its
workers). Memory follows the engine's policy (topoplan.engines MemoryPolicy): the share of GPU memory weights
and KV may use, and the KV block size a sequence's cache is rounded up to. With p stages, p micro-batches
keep every stage busy, and DP replicas multiply throughput.
With expert parallelism (ep > 1, topoplan.plan.moe) a rank holds 1/ep of the routed experts, reads those its
EP group's tokens touch, and each MoE layer pays a dispatch and a combine all-to-all on the EP group's links
plus a TP all-gather in place of the MLP's all-reduce.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from topoplan.dtypes import KV_DTYPES, PLAN_DTYPES, DType, checked_dtype, dtype_of
from topoplan.engines.engine import MemoryPolicy
from topoplan.errors import TopoplanError
from topoplan.layout import STREAMED_WEIGHT_BYTES, Layout, RankCoords, RankGrid, micro_batches, split_layers
from topoplan.limits import check_count
from topoplan.models import ModelSpec
from topoplan.option_fields import option
from topoplan.plan import moe
from topoplan.plan.calibration import Calibration
from topoplan.plan.collectives import LinkPricer, Ring
from topoplan.plan.device import DeviceSpec
from topoplan.plan.served import ServedCost
from topoplan.topology.links import cpu_links

TOKEN_ID_BYTES = 8  # a sampled token id (int64) sent back along the pipeline


@dataclass(frozen=True)
class Workload:
    """What is asked of the deployment: per-replica batch, sequence lengths, weight and KV-cache dtypes."""

    # --batch and --dtype default to None on the command line: settle_workload settles them
    batch: int = field(default=1, metadata=option("--batch", default=None, help="Sequences per DP replica (default 1; "
                                                  "with --objective throughput the default is the largest batch each "
                                                  "layout fits, within the limits)."))
    prompt_len: int = field(default=512, metadata=option("--prompt-len", help="Prompt tokens per sequence."))
    gen_len: int = field(default=128, metadata=option("--gen-len", help="Generated tokens per sequence."))
    dtype: str = field(default="bf16", metadata=option(  # the weights (fp8, int4: quantised linear layers)
        "--dtype", default=None, help="Weights (default bf16, or what a config's quantization_config stores): bf16, "
        "fp16, fp32, fp8 (weight-only on Ampere), mxfp4 or int4 (AWQ/GPTQ, bf16 activations); refused where the GPU "
        "lacks it."))
    kv_dtype: str | None = field(default=None, metadata=option(  # None: the activation dtype (vLLM's auto)
        "--kv-dtype", help="KV cache: bf16, fp16, fp32 or fp8 (default: the activation dtype, bf16 for fp8/int4 "
        "weights)."))

    def __post_init__(self) -> None:
        """The workload's checks, in one place: counts within topoplan.limits' bounds, dtypes the planner prices."""
        for flag, value in (("--batch", self.batch), ("--prompt-len", self.prompt_len), ("--gen-len", self.gen_len)):
            check_count(flag, value)
        checked_dtype(self.dtype, PLAN_DTYPES)
        if self.kv_dtype is not None:
            checked_dtype(self.kv_dtype, KV_DTYPES, "--kv-dtype")

    @property
    def weights(self) -> DType:
        return dtype_of(self.dtype)

    @property
    def kv(self) -> DType:
        return dtype_of(self.kv_dtype) if self.kv_dtype else self.weights.activations


def settle_workload(given: dict[str, Any], objective: str) -> dict[str, Any]:
    """The request fields the workload options settle (PlanRequest's and LaunchRequest's alike, so `launch` plans
    what `plan` plans): --batch and --dtype default to "not given" (None) on the command line: batch 1, or each
    layout's best batch for the throughput objective (`search_batch`); bf16, or what a quantised checkpoint stores
    (`dtype_given` False)."""
    workload = Workload(**{**given, "batch": 1 if given["batch"] is None else given["batch"],
                           "dtype": given["dtype"] or "bf16"})
    return {"workload": workload, "dtype_given": given["dtype"] is not None,
            "search_batch": objective == "throughput" and given["batch"] is None}


@dataclass
class LayoutCost:
    """The priced layout; times in ms, memory in bytes."""

    layout: Layout
    batch: int  # sequences per replica priced (the throughput objective searches it)
    fits: bool
    memory_per_gpu: float
    usable_memory: float
    max_batch: int
    prefill_ms: float
    decode_ms_per_token: float
    tokens_per_s: float  # all replicas together, decode phase
    gpus: int
    request_ms: float  # one request end to end: prefill, then every generated token
    stage_layers: tuple[range, ...]  # the decoder layers each pipeline stage holds (topoplan.layout.split_layers)
    slo_miss: str = ""  # which latency limit (--max-ttft-ms / --max-tpot-ms) this batch misses; "": none
    advice: str = ""  # why the plan ranks it though `inspect` advises against its TP size (topoplan.plan.rank)
    notes: list[str] = field(default_factory=list)  # what the search chose and why (batch, nodes used, ...)
    explain: Callable[[LayoutCost], list[str]] = field(repr=False, compare=False, default=lambda cost: [])
    all_to_all_ms: float = 0.0  # expert parallelism: the MoE dispatch + combine of one decode step
    steps: ReplicaSteps | None = field(default=None, repr=False, compare=False)  # for the served model
    served: ServedCost | None = None  # served at `batch` requests in flight per replica (topoplan.plan.served)
    offline: ServedCost | None = None  # served at the most requests in flight it holds (max-load throughput)
    # `plan --estimator aiconfigurator`: `served` by estimator name, topoplan's built-in one beside it at the same
    # concurrency (topoplan.plan.rank); empty for the built-in estimator alone
    estimates: dict[str, ServedCost] = field(default_factory=dict)

    @cached_property
    def reasons(self) -> list[str]:
        """Why this layout scores as it does (worked out on first use: only shown layouts need it)."""
        return self.explain(self)

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens_per_s / self.gpus


@dataclass(frozen=True)
class Stage:
    """One pipeline stage: its layer range and whether it holds the embedding / LM head."""

    start: int
    end: int
    first: bool
    last: bool

    @property
    def layers(self) -> int:
        return self.end - self.start


def stages_of(model: ModelSpec, pp: int) -> list[Stage]:
    """The model's pipeline stages under the one layer split the runner also runs (topoplan.layout)."""
    return [Stage(r.start, r.stop, i == 0, i == pp - 1) for i, r in enumerate(split_layers(model.layers, pp))]


@dataclass(frozen=True)
class Work:
    """One kind of kernel's work on one GPU: FLOPs and the bytes it must move through HBM."""

    flops: float
    nbytes: float
    rows: float | None = None  # rows (tokens) each of its products multiplies; None: the phase's
    attention: bool = False  # QK^T and AV: in the activation dtype whatever the weights' (fp8 GEMMs, bf16 attention)


class StageModel:
    """Bytes and FLOPs of one stage on one rank: TP-sharded weights, and with expert parallelism (ep > 1) the
    routed experts whole on `ep` ranks, which also see the tokens of the `replicas` DP replicas of their group
    (topoplan.plan.moe). `imbalance(tokens)`: the busiest EP rank's routed work over the mean (1 without EP).

    `weight_bytes`: bytes per decoder-layer weight (quantised formats: scales included); the embedding and the
    LM head are kept in the activation dtype, `act_bytes`; `kv_bytes`: one KV-cache element."""

    def __init__(self, model: ModelSpec, stage: Stage, tp: int, weight_bytes: float, act_bytes: int, kv_bytes: int,
                 ep: int = 1, replicas: int = 1, imbalance: Callable[[float], float] = lambda tokens: 1.0):
        self.m, self.s, self.tp = model, stage, tp
        self.wb, self.ab, self.kvb = weight_bytes, act_bytes, kv_bytes
        self.ep, self.replicas, self.imbalance = ep, replicas, imbalance
        self.experts_over = ep if ep > 1 else tp  # ranks one MoE layer's routed experts are split over
        self.moe = model.moe_layers_in(range(stage.start, stage.end))
        self.dense = stage.layers - self.moe
        self.holds_head = stage.last and (not model.tied_embeddings or not stage.first)
        self.signature = (stage.layers, stage.first, stage.last, self.dense, self.moe, tp, ep, replicas)

    def _routed(self, experts: float) -> float:
        """Routed-expert weights of the stage's MoE layers with `experts` experts per layer."""
        return self.moe * experts * self.m.expert_params

    def _per_rank(self, params: float, routed: float) -> float:
        """One rank's share of `params` weights of which `routed` are routed experts (split over EP ranks)."""
        return (params - routed) / self.tp + routed / self.experts_over

    def weight_bytes(self) -> float:
        """Weights stored on one rank of this stage."""
        m = self.m
        layers = self.dense * m.dense_layer_params + self.moe * m.moe_layer_params
        plain = (m.embedding_params if self.s.first else 0) + (m.head_params if self.holds_head else 0)
        return self._per_rank(layers, self._routed(m.experts)) * self.wb + plain * self.ab / self.tp

    def expert_bytes(self) -> float:
        """Routed-expert weights stored on one rank of this stage."""
        return self._routed(self.m.experts) / self.experts_over * self.wb

    def experts_run(self, tokens: float) -> float:
        """Routed experts per MoE layer whose weights one rank streams when each replica passes `tokens` tokens:
        those its EP group's tokens touch; with EP the busiest rank's share of them (topoplan.plan.moe), without
        EP every touched expert (a 1/tp slice of each)."""
        touched = self.m.experts_touched(tokens * self.replicas)
        return moe.busiest_experts(touched, self.m.experts, self.ep) if self.ep > 1 else touched

    def _dense_gemms(self, tokens: float, head_rows: float) -> Work:
        """One rank's products other than the routed experts for `tokens` tokens per replica (the LM head for
        `head_rows` of them): 2 FLOPs per weight per token, the weights read once; the LM head in the
        activation dtype."""
        m = self.m
        touched = m.experts_touched(tokens * self.replicas)
        params = m.matmul_params(self.dense, self.moe, touched) - self._routed(touched)  # all but routed experts
        head = m.head_params / self.tp if self.s.last else 0.0
        return Work(2.0 * (params / self.tp * tokens + head * head_rows), params / self.tp * self.wb + head * self.ab,
                    tokens)

    def _routed_gemms(self, tokens: float) -> Work:
        """One rank's routed-expert products for `tokens` tokens per replica: the experts it runs
        (`experts_run`) read once, 2 FLOPs per expert weight per (token, expert) pair, scaled with EP by the
        busiest rank's share; each product multiplies the rows its expert got (tokens x k / experts in use)."""
        m = self.m
        pairs = tokens * self.replicas * m.experts_per_token
        flops = 2.0 * m.expert_params * self.moe * pairs / self.experts_over
        if self.ep > 1:
            flops *= self.imbalance(pairs)
        nbytes = self._routed(self.experts_run(tokens)) / (1 if self.ep > 1 else self.tp) * self.wb
        return Work(flops, nbytes, pairs / m.experts_touched(tokens * self.replicas))

    def _gemms(self, tokens: float, head_rows: float) -> list[Work]:
        """The stage's products for `tokens` tokens per replica: the routed experts apart (their few rows each
        make them memory-bound where the rest may be compute-bound: separate kernels, separate rooflines)."""
        dense = self._dense_gemms(tokens, head_rows)
        return [dense, self._routed_gemms(tokens)] if self.moe else [dense]

    def streamed_products(self, tokens: float) -> float:
        """Weight products one rank runs per step for `tokens` tokens per replica whose weight streams from
        memory (STREAMED_WEIGHT_BYTES), as the bundled runner issues them: per layer the fused QKV and the
        output projection, the fused gate/up and the down projection of the MLP, of the shared expert, and of
        each routed expert the rank runs (`experts_run`); the LM head."""
        m = self.m

        def streamed(count: float, params: float, bytes_per_param: float = self.wb) -> float:
            return count if params * bytes_per_param >= STREAMED_WEIGHT_BYTES else 0.0

        attention = streamed(2 * self.s.layers, m.attention_params / 2 / self.tp)
        mlp = streamed(2 * self.dense, m.mlp_params(m.intermediate) / 2 / self.tp)
        shared = streamed(2 * self.moe, m.mlp_params(m.shared_intermediate) / 2 / self.tp)
        whole = self.ep > 1  # EP ranks hold whole experts; without EP every rank holds a slice of each
        routed = streamed(2 * self.moe * self.experts_run(tokens), m.expert_params / 2 / (1 if whole else self.tp))
        head = streamed(1, m.head_params / self.tp, self.ab) if self.s.last else 0.0  # kept in the activation dtype
        return attention + mlp + shared + routed + head

    def kv_bytes_per_token(self) -> float:
        return self.m.kv_elements_per_token_layer(self.tp) * self.s.layers * self.kvb

    def attention_flops(self, queries: float, context: float) -> float:
        """QK^T and AV for `queries` tokens each attending to `context` keys (all heads, this stage)."""
        return self.m.attention_flops(self.s.layers, queries, context)

    def prefill(self, batch: int, prompt: int) -> list[Work]:
        """GEMMs and attention on one rank to prefill `batch` prompts (causal: s(s+1)/2 query-key pairs)."""
        tokens = batch * prompt
        kv_write = tokens * self.kv_bytes_per_token()
        return [*self._gemms(tokens, batch),
                Work(self.attention_flops(batch, prompt * (prompt + 1) / 2) / self.tp, kv_write, attention=True)]

    def decode(self, batch: int, context: float) -> list[Work]:
        """GEMMs and attention on one rank for one decode step of `batch` sequences at `context` tokens."""
        return [*self._gemms(batch, batch),
                Work(self.attention_flops(batch, context) / self.tp, batch * context * self.kv_bytes_per_token(),
                     attention=True)]

    def mixed(self, decodes: float, context: float, prefill_tokens: float, prompt: int) -> list[Work]:
        """One continuous-batching step on one rank: `decodes` sequences' next tokens at `context` tokens and
        `prefill_tokens` prompt tokens (chunks of `prompt`-token prompts) through the same GEMMs, the LM head
        for the decodes and the prompts the step completes; one attention kernel over both (varlen
        FlashAttention): the decodes read their KV cache, each prompt token attends to (prompt + 1) / 2 keys
        on average and writes its KV. `prefill_tokens` 0 is `decode`."""
        kv = self.kv_bytes_per_token()
        attention = Work((self.attention_flops(decodes, context)
                          + self.attention_flops(prefill_tokens, (prompt + 1) / 2)) / self.tp,
                         (decodes * context + prefill_tokens) * kv, attention=True)
        return [*self._gemms(decodes + prefill_tokens, decodes + prefill_tokens / prompt), attention]


class CostModel:
    """Prices layouts of one model on one device type under one calibration."""

    def __init__(self, model: ModelSpec, device: DeviceSpec, workload: Workload, calibration: Calibration,
                 pricer: LinkPricer, memory: MemoryPolicy | None = None):
        self.model, self.device, self.work, self.cal, self.pricer = model, device, workload, calibration, pricer
        self.compute = device.compute_dtype(workload.weights)  # refuses a dtype the GPU cannot run
        device.check_kv(workload.kv)
        self.act_bytes = dtype_of(device.activation_dtype(workload.weights)).bytes
        self.act_compute = device.compute_dtype(dtype_of(device.activation_dtype(workload.weights)))
        # None: the bundled runner's (1 - runtime_reserve of the GPU, a contiguous KV cache)
        self.memory = memory or MemoryPolicy("total", 1 - calibration.runtime_reserve, "", kv_block_tokens=1)
        self.mem_bw = device.memory_bandwidth_gbps * 1e9 * calibration.memory_bandwidth_efficiency
        self._stage_cache: dict[tuple, float] = {}

    def _flop_rate(self, rows: float | None, attention: bool = False) -> float:
        """FLOP/s of products of `rows` rows (the device's rate at those rows where it knows one), in the
        GEMMs' compute dtype or, for attention, the activation dtype."""
        dtype = self.act_compute if attention else self.compute
        return self.device.tflops_at(dtype, rows) * 1e12 * self.cal.flop_efficiency

    def _roofline_ms(self, work: list[Work]) -> float:
        """GEMMs and attention are separate kernels: each is bound by compute or memory, and they add."""
        return sum(max(w.flops / self._flop_rate(w.rows, w.attention), w.nbytes / self.mem_bw) for w in work) * 1e3

    def _stage_ms(self, sm: StageModel, ring: Ring, phase: str, batch: float, group: Ring | None = None,
                  prefill_tokens: float = 0.0) -> float:
        """One stage's time to prefill `batch` prompts or decode one token for `batch` sequences (with
        `prefill_tokens` > 0, a continuous-batching step that also runs that many prompt tokens: StageModel.mixed,
        at the decode step's per-layer overhead, as such steps replay the decode's piecewise CUDA graphs);
        `group` is its EP group when the layout has expert parallelism.

        Memoised: deep pipelines over many identical nodes repeat the same stage shape on the same links."""
        w = self.work
        key = (sm.signature, ring.shape, group.shape if group else None, phase, batch, prefill_tokens)
        if key not in self._stage_cache:
            tokens = batch * w.prompt_len if phase == "prefill" else batch + prefill_tokens
            t = self._compute_ms(sm, phase, batch, prefill_tokens, tokens)
            t += self._tp_comm_us(sm, ring, tokens, batch + prefill_tokens / w.prompt_len) / 1e3
            if group is not None:
                t += self._ep_comm_us(sm, ring, group, tokens) / 1e3
            self._stage_cache[key] = t
        return self._stage_cache[key]

    def _compute_ms(self, sm: StageModel, phase: str, batch: float, prefill_tokens: float, tokens: float) -> float:
        """The stage's compute for that step (`tokens`: the rows it runs): the roofline of its GEMMs and attention
        plus the per-layer, per-product and per-expert overheads. topoplan.plan.aic_estimator replaces this part
        only; the collectives stay _stage_ms's."""
        w = self.work
        if phase == "prefill":
            work = sm.prefill(batch, w.prompt_len)
        elif prefill_tokens:
            work = sm.mixed(batch, w.prompt_len + w.gen_len / 2, prefill_tokens, w.prompt_len)
        else:
            work = sm.decode(batch, w.prompt_len + w.gen_len / 2)
        overhead = self.cal.layer_overhead_us if phase == "prefill" else self.cal.decode_layer_us
        t = self._roofline_ms(work) + sm.s.layers * overhead / 1e3
        t += sm.streamed_products(tokens) * self.cal.matmul_call_us / 1e3
        if sm.moe:
            per_layer = self.cal.moe_layer_overhead_us + sm.experts_run(tokens) * self.cal.expert_overhead_us
            t += sm.moe * per_layer / 1e3
        return t

    def _tp_comm_us(self, sm: StageModel, ring: Ring, tokens: float, batch: float) -> float:
        """One stage's TP collectives for one step: 2 all-reduces per layer of the tokens' activations, the
        vocab-parallel embedding's all-reduce on the first stage, the logits all-gather on the last (one
        row of logits per sequence)."""
        activations = tokens * self.model.hidden * self.act_bytes
        count = 2 * sm.s.layers + (1 if sm.s.first else 0) - (sm.moe if sm.ep > 1 else 0)
        t = count * self.pricer.allreduce_us(ring, activations)
        if sm.s.last:
            t += self.pricer.allgather_us(ring, batch * self.model.vocab * self.act_bytes)
        return t

    def _alltoall_us(self, sm: StageModel, group: Ring, tokens: float) -> float:
        """Dispatch + combine of one MoE layer: each rank sends its dispatched tokens' hidden states to their
        k experts and gets k results back, the busiest rank's share scaled by the routing imbalance."""
        sent = tokens * sm.replicas / sm.ep  # each rank's slice of its EP group's tokens
        nbytes = sent * self.model.experts_per_token * self.model.hidden * self.act_bytes
        skew = sm.imbalance(tokens * sm.replicas * self.model.experts_per_token)
        return 2 * self.pricer.alltoall_us(group, nbytes * skew)

    def _ep_comm_us(self, sm: StageModel, ring: Ring, group: Ring, tokens: float) -> float:
        """Per MoE layer: the all-to-alls, then the TP all-gather that rebuilds every token on each TP rank
        (replacing the MLP's all-reduce, which _tp_comm_us leaves out)."""
        if not sm.moe:
            return 0.0
        gather = self.pricer.allgather_us(ring, tokens * self.model.hidden * self.act_bytes) if sm.tp > 1 else 0.0
        return sm.moe * (self._alltoall_us(sm, group, tokens) + gather)

    def _handoff_ms(self, a: Ring, b: Ring, tokens: float) -> float:
        """Activations of `tokens` tokens from one stage to the next."""
        return self.pricer.handoff_us(a, b, tokens * self.model.hidden * self.act_bytes) / 1e3

    def _step_extra_ms(self, rings: list[Ring], batch: float) -> float:
        """What one step pays besides its stages and hand-offs: the sampled token ids (int64) going back
        from the last stage to the first when there are several, and the per-step fixed overhead (plus its
        per-rank share for every rank of the replica beyond the first and its per-sequence share for each of
        the `batch` sequences in the step)."""
        back = self.pricer.handoff_us(rings[-1], rings[0], batch * TOKEN_ID_BYTES) / 1e3 if len(rings) > 1 else 0.0
        ranks, cal = len(rings) * len(rings[0]), self.cal
        return back + (cal.step_overhead_us + (ranks - 1) * cal.step_overhead_per_rank_us
                       + batch * cal.sequence_overhead_us) / 1e3

    def _pipeline_ms(self, rings: list[Ring], models: list[StageModel], batch: float,
                     groups: Sequence[Ring | None], prefill_tokens: float = 0.0) -> tuple[float, list[float]]:
        """(time for one decode step through every stage, per-stage times) at `batch` sequences (and
        `prefill_tokens` prompt tokens in the same step: _stage_ms)."""
        stage_ms = [self._stage_ms(sm, ring, "decode", batch, g, prefill_tokens)
                    for sm, ring, g in zip(models, rings, groups)]
        handoffs = sum(self._handoff_ms(a, b, batch + prefill_tokens) for a, b in zip(rings, rings[1:]))
        return sum(stage_ms) + handoffs + self._step_extra_ms(rings, batch), stage_ms

    def _prefill_ms(self, rings: list[Ring], models: list[StageModel], groups: Sequence[Ring | None],
                    batch: float) -> float:
        """One replica's prefill of `batch` prompts alone: every stage in series, the hand-offs, the step's
        extras."""
        w = self.work
        prefill = sum(self._stage_ms(sm, ring, "prefill", batch, g) for sm, ring, g in zip(models, rings, groups))
        prefill += sum(self._handoff_ms(a, b, batch * w.prompt_len) for a, b in zip(rings, rings[1:]))
        return prefill + self._step_extra_ms(rings, batch)

    def _step_ms(self, rings: list[Ring], models: list[StageModel], groups: Sequence[Ring | None], batch: float,
                 prefill_tokens: float = 0.0) -> float:
        """Time between a sequence's consecutive tokens when a replica runs `batch` sequences (and
        `prefill_tokens` prompt tokens in one of its micro-batches): with p stages, m = min(p, batch)
        micro-batches keep the stages busy, so a step is the slower of the prompt-carrying micro-batch's trip
        through the pipeline and the busiest stage's turn at all m (without prompt tokens: m times the slowest
        stage)."""
        micro = micro_batches(len(rings), batch)
        through, heavy = self._pipeline_ms(rings, models, batch / micro, groups, prefill_tokens)
        if micro == 1:
            return through
        light = self._pipeline_ms(rings, models, batch / micro, groups)[1] if prefill_tokens else heavy
        return max(through, max((micro - 1) * a + b for a, b in zip(light, heavy)))

    def stage_models(self, layout: Layout) -> list[StageModel]:
        """The layout's stages as one rank sees them, in this workload's dtypes (with EP: its experts, its
        group's tokens)."""
        m, w, ep = self.model, self.work, layout.ep if self.model.is_moe else 1
        replicas = moe.group_replicas(layout) if ep > 1 else 1
        return [StageModel(m, s, layout.tp, w.weights.weight_bytes, self.act_bytes, w.kv.bytes, ep, replicas,
                           lambda n: moe.imbalance(n, ep))
                for s in stages_of(m, layout.pp)]

    def _memory(self, layout: Layout, models: list[StageModel], batch: int) -> tuple[float, float, int]:
        """(need, room) of the stage furthest over the engine's room at `batch` sequences per replica, and the
        largest batch whose KV cache (whole KV blocks) fits beside the weights on every stage."""
        w, total, policy = self.work, self.device.memory_bytes, self.memory
        seq = policy.kv_tokens(w.prompt_len + w.gen_len)  # whole KV blocks
        fullest, max_batch = (0.0, math.inf), math.inf
        for i, sm in enumerate(models):
            weights, kv = sm.weight_bytes(), seq * sm.kv_bytes_per_token()
            need, room = weights + batch * kv, policy.usable_bytes(total, weights, layout.tp)
            if i == 0 or need - room > fullest[0] - fullest[1]:
                fullest = (need, room)
            max_batch = min(max_batch, math.floor(max(room - weights, 0) / kv))
        return fullest[0], fullest[1], int(max_batch)

    def max_batch(self, layout: Layout) -> int:
        """Sequences per replica whose KV cache fits beside the weights on every stage, under the engine's
        memory policy: floor((usable - weights per GPU) / (KV tokens per sequence x KV bytes/token))."""
        return self._memory(layout, self.stage_models(layout), 1)[2]

    def price(self, layout: Layout, replicas: list[list[Ring]], ep_groups: list[list[Ring]] | None = None,
              batch: int | None = None) -> LayoutCost:
        """Price `layout` at `batch` sequences per replica (None: the workload's); `replicas` lists, per
        distinct replica, its TP group rings stage by stage, and `ep_groups` (needed when layout.ep > 1:
        topoplan.plan.moe.ep_rings) the EP group of each of them."""
        w, m = self.work, self.model
        batch = batch or w.batch
        stages = stages_of(m, layout.pp)
        models = self.stage_models(layout)
        expert_parallel = layout.ep > 1 and m.is_moe
        if expert_parallel and ep_groups is None:
            raise TopoplanError(f"{layout}: pricing expert parallelism needs the EP groups' placement")
        groups_of = ep_groups if expert_parallel else [[None] * layout.pp for _ in replicas]
        memory, usable, max_batch = self._memory(layout, models, batch)
        context = w.prompt_len + w.gen_len / 2
        worst = None
        for rings, groups in zip(replicas, groups_of):
            decode, _ = self._pipeline_ms(rings, models, batch, groups)
            if worst is None or decode > worst[0]:
                worst = (decode, rings, groups)
        decode, rings, groups = worst
        prefill = self._prefill_ms(rings, models, groups, batch)
        step = self._step_ms(rings, models, groups, batch)
        return LayoutCost(layout, batch, memory <= usable, memory, usable, max_batch, prefill, decode,
                          layout.dp * batch / step * 1e3, layout.world, prefill + w.gen_len * decode,
                          tuple(range(s.start, s.end) for s in stages),
                          explain=lambda cost: self.reasons(layout, cost, rings, models, context, groups),
                          all_to_all_ms=self.alltoall_ms(models, groups, batch),
                          steps=ReplicaSteps(self, rings, models, groups))

    def alltoall_ms(self, models: list[StageModel], groups: Sequence[Ring | None], batch: int) -> float:
        """The MoE all-to-alls (dispatch + combine, every MoE layer) of one decode step; 0 without EP."""
        return sum(self._alltoall_us(sm, g, batch) * sm.moe for sm, g in zip(models, groups) if g) / 1e3

    def _tp_reason(self, layout: Layout, cost: LayoutCost, rings: list[Ring], models: list[StageModel],
                   expert_parallel: bool) -> tuple[str, str | None]:
        """Where the TP groups run and what their all-reduces cost (with EP the MoE layers' MLP all-reduces
        are all-gathers, counted with the all-to-alls), and the fabric's name. A group crossing the network
        says so whatever its slowest hop is (many fast NICs can leave NVLink or a SYS hop the bottleneck),
        naming that hop; one crossing nodes inside a multi-node NVLink domain (NVL72) says that instead."""
        hop = min((self.pricer.bottleneck(r) for r in rings), key=lambda h: h.bandwidth_gbps)
        hops = [h for r in rings for h in self.pricer.ring_hops(r)]
        net = next((h for h in hops if h.link_class == "net"), None)
        fabric = {"nvlink": "NVLink", "xgmi": "XGMI"}.get(hop.link_class)
        if net is not None:
            where = "spans nodes"
        elif fabric and any(h.across_nodes for h in hops):
            where = "spans nodes over NVLink (one multi-node NVLink domain)"
        else:
            where = f"on {fabric}" if fabric else f"spans a {hop.code} hop"
        if hop.link_class == "sys":
            cpu = cpu_links(self.pricer.topology.cpu)
            where += f" ({cpu.family} interconnect {cpu.inter_socket_gbps:g} GB/s" + (
                ", the default: --cpu names the family)" if self.pricer.topology.cpu is None else ")")
        slowest = "" if net is None or hop is net else f" on {hop.code} (network hop {net.bandwidth_gbps:.0f} GB/s)"
        comm_ms = sum(self._tp_comm_us(sm, r, cost.batch, cost.batch) / 1e3 for sm, r in zip(models, rings))
        reduces = 2 * self.model.layers + 1 - (sum(sm.moe for sm in models) if expert_parallel else 0)
        return (f"TP{layout.tp} {where}: ring bottleneck {hop.bandwidth_gbps:.0f} GB/s{slowest}; "
                f"{reduces} all-reduces + 1 all-gather/token cost {comm_ms:.2f} ms"), fabric

    def reasons(self, layout: Layout, cost: LayoutCost, rings: list[Ring], models: list[StageModel],
                context: float, groups: Sequence[Ring | None] = ()) -> list[str]:
        """Why this layout scores as it does: fit, TP ring bottleneck, PP boundary, what dominates decode."""
        gib = 2**30
        out = []
        if not cost.fits:
            out.append(f"does not fit: needs {cost.memory_per_gpu / gib:.1f} GiB/GPU, {cost.usable_memory / gib:.1f} "
                       f"usable (max batch {cost.max_batch})")
        if cost.slo_miss:
            out.append(cost.slo_miss)
        if any(groups):  # for an MoE model the decisive question (topoplan.plan.plan_table shows reasons[0])
            out.extend(self._ep_reasons(layout, cost, rings, models, groups))
        if layout.tp > 1:
            reason, fabric = self._tp_reason(layout, cost, rings, models, any(groups))
            out.append(reason)
            if cost.advice:
                out.append(cost.advice)
            decode_bytes = cost.batch * self.model.hidden * self.act_bytes
            kernel = self.pricer.allreduce_kernel(rings[0], decode_bytes)
            mesh = all(self.pricer.is_nvlink_mesh(r) for r in rings)
            if kernel != "nccl":
                out.append(f"{fabric or 'NVLink'} full mesh: decode all-reduces use the engine's {kernel} kernel")
            elif mesh and fabric == "XGMI":
                out.append("XGMI full mesh: vLLM's custom all-reduce on ROCm would cut the all-reduce latency "
                           "priced here as an RCCL ring")
            elif mesh:
                out.append("NVLink full mesh: vLLM/TensorRT-LLM one-shot all-reduce (or NVLS on NVSwitch) would "
                           "cut the all-reduce latency priced here as an NCCL ring (plan --engine vllm prices it)")
        if layout.pp > 1:
            boundary = min((self.pricer.boundary(a, b) for a, b in zip(rings, rings[1:])),
                           key=lambda h: h.bandwidth_gbps)
            split = "/".join(str(sm.s.layers) for sm in models)
            out.append(f"PP{layout.pp} stages of {split} layers; slowest boundary {boundary.describe()}")
        work = [w for sm in models for w in sm.decode(cost.batch, context)]
        compute = sum(w.flops / self._flop_rate(w.rows, w.attention) for w in work)
        memory = sum(w.nbytes for w in work) / self.mem_bw
        out.append(f"decode is {'compute' if compute >= memory else 'memory'}-bound: "
                   f"{sum(w.nbytes for w in work) / 1e9:.2f} GB read per GPU per step")
        weights = self.work.weights
        if self.compute != weights.short:
            out.append(f"{weights.short} weights are weight-only here: stored at {weights.weight_bytes:.3g} B/param, "
                       f"dequantised for GEMMs at the {self.compute} rate ({self.device.dtype_note})")
        if layout.dp > 1:
            out.append(f"DP{layout.dp} replicas multiply throughput")
        return out + cost.notes

    def _ep_reasons(self, layout: Layout, cost: LayoutCost, rings: list[Ring], models: list[StageModel],
                    groups: Sequence[Ring | None]) -> list[str]:
        """Where the EP group sits, what its all-to-alls cost, and whether EP beat TP-sharded experts here."""
        gb, w, m = 1e9, self.work, self.model
        hop = min((self.pricer.group_bottleneck(g) for g in groups if g), key=lambda h: h.bandwidth_gbps)
        where = "spans nodes" if hop.link_class == "net" else (
            "inside an NVLink domain" if hop.link_class == "nvlink" else f"crosses a {hop.code} hop")
        skew = models[0].imbalance(cost.batch * models[0].replicas * m.experts_per_token)
        twin = self.stage_models(replace(layout, ep=1))
        tp_decode, _ = self._pipeline_ms(rings, twin, cost.batch, [None] * layout.pp)
        tp_memory = max(sm.weight_bytes() for sm in twin) + cost.batch * (w.prompt_len + w.gen_len) * max(
            sm.kv_bytes_per_token() for sm in twin)
        verdict = "beats" if cost.decode_ms_per_token < tp_decode else "loses to"
        return [f"EP{layout.ep} {where} ({hop.describe()}): {2 * m.moe_layers} all-to-alls/token (dispatch + combine, "
                f"top-{m.experts_per_token}, busiest rank x{skew:.2f}) cost {cost.all_to_all_ms:.2f} ms",
                f"EP{layout.ep} {verdict} TP{layout.tp}-sharded experts for the MoE layers: decode "
                f"{cost.decode_ms_per_token:.2f} vs {tp_decode:.2f} ms/token; experts "
                f"{max(sm.expert_bytes() for sm in models) / gb:.1f} vs "
                f"{max(sm.expert_bytes() for sm in twin) / gb:.1f} GB/GPU, total {cost.memory_per_gpu / gb:.1f} vs "
                f"{tp_memory / gb:.1f} GB/GPU"]


@dataclass(frozen=True)
class ReplicaSteps:
    """The step times of a priced layout's slowest replica, which the served model (topoplan.plan.served)
    combines: a continuous-batching step of some decodes and prompt tokens, a prefill alone."""

    costs: CostModel
    rings: list[Ring]
    models: list[StageModel]
    groups: Sequence[Ring | None]

    def step_ms(self, decodes: float, prefill_tokens: float = 0.0) -> float:
        """A step of `decodes` sequences' next tokens and `prefill_tokens` prompt tokens (CostModel._step_ms)."""
        return self.costs._step_ms(self.rings, self.models, self.groups, decodes, prefill_tokens)

    def prefill_ms(self, prompts: float) -> float:
        """`prompts` prompts prefilled alone (CostModel._prefill_ms)."""
        return self.costs._prefill_ms(self.rings, self.models, self.groups, prompts)


def replica_rings(layout: Layout, order: Sequence[str]) -> list[list[Ring]]:
    """TP group rings (stage by stage) of the distinct replicas. All nodes are identical, so only the
    replicas that start on node 0 need pricing, and a ring's shape is its first rank's place on its node."""
    k, tp = len(order), layout.tp
    count = max(1, min(layout.dp, k // (tp * layout.pp)))
    shapes: dict[int, tuple] = {}

    def ring(first: int) -> Ring:
        offset = first % k
        if offset not in shapes:
            shapes[offset] = tuple(((offset + t) // k, order[(offset + t) % k]) for t in range(tp))
        return Ring(first // k, shapes[offset], (order, offset, tp))

    grid = RankGrid(layout)  # each TP group's ring starts at its tp_rank 0
    return [[ring(grid.rank(RankCoords(0, p, d))) for p in range(layout.pp)] for d in range(count)]
