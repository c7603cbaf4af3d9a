"""`plan --estimator aiconfigurator`: kernel times from NVIDIA's aiconfigurator, links from topoplan.

aiconfigurator (the `aiconfigurator-core` package, Apache-2.0, the optional extra `topoplan[aiconfigurator]`)
ships per-GPU, per-engine-version kernel timings collected on real GPUs (GEMMs, context and generation attention,
MoE experts, element-wise ops, embedding) and a compiled engine that looks them up for a model's shapes. It
models NVSwitch-class boxes only; topoplan knows the user's real topology. So this estimator takes each pipeline
stage's COMPUTE from aiconfigurator's silicon data for this model at this TP degree, and keeps everything else
from topoplan's cost model: the TP all-reduces priced by LinkPricer on the ring the placement chose, PP
hand-offs, the per-step overhead, memory, and the served model on top (KernelCostModel below overrides only
CostModel._compute_ms). Nothing of aiconfigurator's data is copied here: the package is imported lazily, only when
this estimator is asked for (`load`); `note_for` says where it would apply without importing it.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from topoplan.engines.engine import Engine, version_tuple
from topoplan.errors import TopoplanError
from topoplan.models import ModelSpec
from topoplan.plan.cost import CostModel, StageModel

ESTIMATORS = ("builtin", "aiconfigurator")
PACKAGE = "aiconfigurator_core"  # the import name of the aiconfigurator-core distribution
INSTALL = "pip install 'topoplan[aiconfigurator]'"
# topoplan GPU (topoplan.hardware) -> aiconfigurator system with silicon data for vLLM, SGLang and TensorRT-LLM
# (aiconfigurator-core 0.12: systems/query_versions.yaml; its h100_pcie, a100_pcie, l4 and a30 hold none). Only
# exact products: a100-sxm4-40gb (slower HBM) and the RTX PRO 6000 editions topoplan lumps together stay out.
SYSTEMS = {"h100-sxm": "h100_sxm", "h200": "h200_sxm", "a100-sxm4-80gb": "a100_sxm", "b200": "b200_sxm",
           "b300": "b300_sxm", "gb200": "gb200", "gb300": "gb300", "l40s": "l40s"}
BACKENDS = ("vllm", "sglang", "trtllm")  # topoplan engine names = aiconfigurator backend names
GEMM_MODES = {"bf16": "bfloat16", "fp16": "bfloat16", "fp8": "fp8", "int4": "int4_wo"}  # weights -> GEMM quant
KV_MODES = {"bf16": "bfloat16", "fp16": "bfloat16", "fp8": "fp8"}
COMPUTE_OPS = ("Gemm", "Elementwise", "Embedding", "ContextAttention", "GenerationAttention", "Moe")
LINK_OPS = ("CustomAllReduce", "P2P", "MoeDispatch")  # priced by topoplan's LinkPricer instead


def covers(gpu: str, engine: Engine) -> bool:
    """Whether aiconfigurator has kernel data for this GPU and engine (a static table: no import)."""
    return gpu in SYSTEMS and engine.name in BACKENDS


def note_for(gpu: str, engine: Engine) -> tuple[str, ...]:
    """The one-line note for a built-in plan where the extra would apply and is not installed."""
    if not covers(gpu, engine) or importlib.util.find_spec(PACKAGE) is not None:
        return ()
    return (f"aiconfigurator has measured kernel times for {engine.name} on {gpu}: {INSTALL} and pass "
            "--estimator aiconfigurator to use them (links stay topoplan's)",)


def _architecture(m: ModelSpec) -> dict[str, Any]:
    """The HF config aiconfigurator reads for this model: dense GQA (Llama, Qwen2 with QKV bias, Qwen3 with QK
    norm) or a MoE model whose every layer routes to experts with no shared one (Mixtral; Qwen3-MoE with QK
    norm); others are refused."""
    plain = m.gated_mlp and m.layer_norms == 2 and not m.is_mla
    if m.is_moe and plain and not m.shared_experts and m.moe_layers == m.layers and not m.attention_bias:
        if m.qk_norm:
            return {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_experts": m.experts,
                    "num_experts_per_tok": m.experts_per_token, "moe_intermediate_size": m.expert_intermediate,
                    "intermediate_size": m.intermediate, "decoder_sparse_step": 1, "mlp_only_layers": [],
                    "norm_topk_prob": True}
        return {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "num_local_experts": m.experts,
                "num_experts_per_tok": m.experts_per_token, "intermediate_size": m.expert_intermediate}
    if not m.is_moe and plain and not (m.qk_norm and m.attention_bias):
        arch = "Qwen3ForCausalLM" if m.qk_norm else "Qwen2ForCausalLM" if m.attention_bias else "LlamaForCausalLM"
        return {"architectures": [arch], "model_type": arch.removesuffix("ForCausalLM").lower(),
                "intermediate_size": m.intermediate}
    raise TopoplanError(f"--estimator aiconfigurator prices dense GQA models (Llama, Qwen2, Qwen3) and MoE models "
                        f"with experts in every layer and no shared expert (Mixtral, Qwen3-MoE); {m.name} is neither: "
                        "use the built-in estimator")


def hf_config(m: ModelSpec) -> dict[str, Any]:
    """`m` as the config.json aiconfigurator's model builder reads (written to a temporary folder: given a
    name instead, it would try the Hugging Face hub)."""
    return {"hidden_size": m.hidden, "num_hidden_layers": m.layers, "num_attention_heads": m.heads,
            "num_key_value_heads": m.kv_heads, "head_dim": m.head_dim, "vocab_size": m.vocab,
            "max_position_embeddings": m.max_context or 131072, "tie_word_embeddings": m.tied_embeddings,
            "hidden_act": "silu", "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16", **_architecture(m)}


def pick_version(slots: dict[str, str], engine: Engine) -> str:
    """aiconfigurator's complete collection (its `current` or `previous` slot) nearest the engine's version:
    the newest not newer than it, else the oldest. `engine.pinned` (NAME@VERSION) or the profile's newest."""
    want = version_tuple(engine.pinned or engine.covers[1]) or ()
    complete = sorted({v for k, v in slots.items() if k in ("current", "previous") and v}, key=version_tuple)
    if not complete:
        raise TopoplanError(f"aiconfigurator holds no complete {engine.name} collection here (slots {slots})")
    return ([v for v in complete if version_tuple(v) <= want] or complete)[-1]


def _lerp(f: Callable[[int], float], v: float) -> float:
    """f at a fractional count (the served model's mean batches), linear between the whole counts; f(0) = 0."""
    if v <= 0:
        return 0.0
    lo = math.floor(v)
    low = f(lo) if lo else 0.0
    return low if lo == v else low + (f(lo + 1) - low) * (v - lo)


@dataclass
class OpList:
    """One phase's compiled ops of a TP degree: the indices of each role (per-layer, embedding, LM head,
    attention) among the compute ops, the link ops left out."""

    layer: list[int] = field(default_factory=list)  # per-layer ops whose values cover every layer
    attention: list[int] = field(default_factory=list)  # (per layer too) the attention kernel
    embedding: list[int] = field(default_factory=list)
    head: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, ops: list[dict[str, Any]], layers: int) -> OpList:
        """The roles of `ops` (aiconfigurator's OpSpec JSON), checking that each per-layer op covers all `layers`
        (a stage takes its share of them) and the embedding and LM head once."""
        out = cls()
        for i, op in enumerate(ops):
            (kind, spec), = op.items()
            if kind in LINK_OPS:
                continue
            if kind not in COMPUTE_OPS:
                raise TopoplanError(f"aiconfigurator's op {kind} ({spec.get('name')}) is not one topoplan knows how "
                                    "to place: use the built-in estimator")
            role = ("embedding" if kind == "Embedding" else "head" if "logits" in spec["name"]
                    else "attention" if kind.endswith("Attention") else "layer")
            if spec.get("scale_factor") != (layers if role in ("layer", "attention") else 1):
                raise TopoplanError(f"aiconfigurator's op {spec.get('name')} covers {spec.get('scale_factor')} "
                                    f"layers of {layers}: not a stack topoplan can split over pipeline stages")
            getattr(out, role).append(i)
        return out


@dataclass
class AicKernels:
    """aiconfigurator's kernel times for one model, GPU, engine version and dtypes: a stage's compute on one
    rank per phase, from the model's ops compiled at each TP degree (cached per process)."""

    model: ModelSpec
    system: str
    backend: str
    version: str
    engine: str
    gemm: str
    kv: str
    package: str
    _compiled: dict[int, tuple[Any, OpList, OpList]] = field(default_factory=dict, repr=False)
    _values: dict[tuple, float] = field(default_factory=dict, repr=False)

    @property
    def label(self) -> str:
        return (f"aiconfigurator-core {self.package}: {self.system} {self.backend} {self.version} kernel data "
                f"for {self.engine}; links, hand-offs and step overhead: topoplan")

    def describe(self) -> dict[str, str]:
        return {"name": "aiconfigurator", "package": f"aiconfigurator-core {self.package}", "system": self.system,
                "backend": self.backend, "version": self.version, "for_engine": self.engine,
                "from_aiconfigurator": "GEMM, attention, MoE expert, element-wise and embedding kernel times",
                "from_topoplan": "all-reduces, all-gathers, PP hand-offs, all-to-alls on this topology; step "
                                 "overhead; memory; the served model"}

    def _ops(self, tp: int) -> tuple[Any, OpList, OpList]:
        if tp not in self._compiled:
            self._compiled[tp] = _compile(json.dumps(hf_config(self.model), sort_keys=True), self.system,
                                          self.backend, self.version, tp, self.gemm, self.kv)
        return self._compiled[tp]

    def _context(self, tp: int, roles: tuple[str, ...], batch: int, s: int) -> float:
        """Context-phase ops of `roles` summed: `batch` prompts of `s` tokens (GEMMs see batch x s rows, the LM
        head one row per prompt)."""
        key = ("ctx", tp, roles, batch, s)
        if key not in self._values:
            handle, ctx, _ = self._ops(tp)
            idx = [i for r in roles for i in getattr(ctx, r)]
            self._values[key] = self._sum(tp, lambda: handle.evaluate_context_ops(idx, batch_size=batch, s=s))
        return self._values[key]

    def _generation(self, tp: int, roles: tuple[str, ...], batch: int, s: int) -> float:
        """Generation-phase ops of `roles` summed: one token for each of `batch` sequences at `s` tokens of KV."""
        key = ("gen", tp, roles, batch, s)
        if key not in self._values:
            handle, _, gen = self._ops(tp)
            idx = [i for r in roles for i in getattr(gen, r)]
            self._values[key] = self._sum(tp, lambda: handle.evaluate_generation_ops(idx, batch_size=batch, s=s))
        return self._values[key]

    def _sum(self, tp: int, evaluate: Callable[[], list[tuple]]) -> float:
        """The evaluated ops' total ms; aiconfigurator's refusal (no table for this quantisation, a shape out of
        its data) as one line."""
        try:
            return sum(v[1] for v in evaluate())
        except (ValueError, RuntimeError) as error:
            raise TopoplanError(f"aiconfigurator cannot price this plan at TP{tp} from its {self.system} "
                                f"{self.backend} {self.version} data: {str(error).splitlines()[0][:240]}") from None

    def _stage(self, sm: StageModel, layer_ms: float, embedding_ms: float, head_ms: float) -> float:
        """The whole model's per-layer op times cut to this stage's layers, with the embedding on the first
        stage and the LM head on the last."""
        return (layer_ms * sm.s.layers / self.model.layers + (embedding_ms if sm.s.first else 0.0)
                + (head_ms if sm.s.last else 0.0))

    def prefill_ms(self, sm: StageModel, prompts: float, prompt: int) -> float:
        """`prompts` prompts of `prompt` tokens prefilled together on one rank of this stage."""
        tp = sm.tp
        part = lambda roles: _lerp(lambda n: self._context(tp, roles, n, prompt), prompts)  # noqa: E731
        return self._stage(sm, part(("layer", "attention")), part(("embedding",)), part(("head",)))

    def decode_ms(self, sm: StageModel, decodes: float, context: float) -> float:
        """One token for each of `decodes` sequences at `context` tokens of KV."""
        tp, s = sm.tp, round(context)
        part = lambda roles: _lerp(lambda n: self._generation(tp, roles, n, s), decodes)  # noqa: E731
        return self._stage(sm, part(("layer", "attention")), part(("embedding",)), part(("head",)))

    def mixed_ms(self, sm: StageModel, decodes: float, context: float, prefill_tokens: float, prompt: int) -> float:
        """A continuous-batching step: the GEMMs and element-wise ops over decodes + prompt tokens, generation
        attention for the decodes, the prompt tokens' share (prefill_tokens / prompt) of one whole prompt's
        context attention, the LM head for the decodes and the prompts completed."""
        tp, s, tokens = sm.tp, round(context), decodes + prefill_tokens
        dense = _lerp(lambda n: self._context(tp, ("layer",), 1, n), tokens)
        embedding = _lerp(lambda n: self._context(tp, ("embedding",), 1, n), tokens)
        head = _lerp(lambda n: self._generation(tp, ("head",), n, s), decodes + prefill_tokens / prompt)
        attention = (_lerp(lambda n: self._generation(tp, ("attention",), n, s), decodes)
                     + self._context(tp, ("attention",), 1, prompt) * prefill_tokens / prompt)
        return self._stage(sm, dense + attention, embedding, head)


@lru_cache(maxsize=64)
def _compile(config: str, system: str, backend: str, version: str, tp: int, gemm: str, kv: str) -> tuple:
    """aiconfigurator's compiled engine for the model `config` at TP `tp` (its perf database loads once per
    process inside the package; compiling a further TP degree takes milliseconds), and its ops' roles."""
    import tempfile

    from aiconfigurator_core.sdk.engine import EngineHandle, _ops_json  # the optional extra
    from aiconfigurator_core.sdk.models import get_model

    quant = {"gemm_quant_mode": gemm, "kvcache_quant_mode": kv, "fmha_quant_mode": "bfloat16",
             "moe_quant_mode": gemm if gemm in ("bfloat16", "fp8", "int4_wo") else None}
    with tempfile.TemporaryDirectory(prefix="topoplan-aic-") as folder:
        (Path(folder) / "config.json").write_text(config)
        try:
            handle = EngineHandle.compile(folder, system, backend, backend_version=version, tp_size=tp,
                                          moe_tp_size=tp, moe_ep_size=1, **quant)
            from aiconfigurator_core.sdk.config_builders import build_model_config

            built = get_model(folder, build_model_config(tp_size=tp, pp_size=1, attention_dp_size=1, moe_tp_size=tp,
                                                         moe_ep_size=1, comm_quant_mode=None, forward_model=None,
                                                         attention_backend=None, **quant), backend)
        except (ValueError, KeyError, NotImplementedError, RuntimeError) as error:
            raise TopoplanError(f"aiconfigurator cannot price this model at TP{tp} on {system} {backend} "
                                f"{version}: {str(error).splitlines()[0][:200]}") from None
    ops = [OpList.of(json.loads(_ops_json(getattr(built, phase))), json.loads(config)["num_hidden_layers"])
           for phase in ("context_ops", "generation_ops")]
    return handle, *ops


def load(model: ModelSpec, gpu: str, engine: Engine, dtype: str, kv_dtype: str) -> AicKernels:
    """The estimator for this plan, or a one-line refusal: the extra not installed, or a GPU, engine, dtype or
    model aiconfigurator does not cover."""
    if importlib.util.find_spec(PACKAGE) is None:
        raise TopoplanError(f"--estimator aiconfigurator needs the optional extra: {INSTALL}")
    if not covers(gpu, engine):
        raise TopoplanError(f"--estimator aiconfigurator: no aiconfigurator kernel data for {engine.name} on {gpu} "
                            f"(it covers {', '.join(BACKENDS)} on {', '.join(SYSTEMS)})")
    if dtype not in GEMM_MODES or kv_dtype not in KV_MODES:
        raise TopoplanError(f"--estimator aiconfigurator prices weights {', '.join(GEMM_MODES)} and KV "
                            f"{', '.join(KV_MODES)}; got --dtype {dtype}, KV {kv_dtype}")
    _architecture(model)  # refuse an architecture before the package loads
    logging.getLogger(PACKAGE).setLevel(logging.ERROR)  # its data-provenance notes are not the user's concern
    from importlib import metadata

    from aiconfigurator_core.sdk.perf_database import get_version_slots

    system = SYSTEMS[gpu]
    version = pick_version(get_version_slots(system, engine.name) or {}, engine)
    return AicKernels(model, system, engine.name, version, str(engine), GEMM_MODES[dtype], KV_MODES[kv_dtype],
                      metadata.version("aiconfigurator-core"))


class KernelCostModel(CostModel):
    """topoplan's cost model with each stage's compute from aiconfigurator's kernel times (AicKernels) in place
    of the roofline and its per-layer overheads; the stage's TP and EP collectives, the PP hand-offs and the
    step's extras stay topoplan's, priced on the placement's links."""

    def __init__(self, *args: Any, kernels: AicKernels, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.kernels = kernels

    def _compute_ms(self, sm: StageModel, phase: str, batch: float, prefill_tokens: float, tokens: float) -> float:
        w, k = self.work, self.kernels
        context = w.prompt_len + w.gen_len / 2
        if phase == "prefill":
            return k.prefill_ms(sm, batch, w.prompt_len)
        if prefill_tokens:
            return k.mixed_ms(sm, batch, context, prefill_tokens, w.prompt_len)
        return k.decode_ms(sm, batch, context)
