"""One rank of the runner: join the job, load this rank's shard, generate, gather the results on rank 0.

Started once per rank by `topoplan run`, torchrun, mpirun or srun (`python -m topoplan.runner ...`); the
rank comes from the launcher's environment (topoplan.rank_env). Rank 0 prints the result (text or JSON).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from topoplan.atomic import atomic_path
from topoplan.errors import TopoplanError
from topoplan.layout import Layout, layer_split_json, split_layers
from topoplan.rank_env import RankEnv
from topoplan.run_options import RunOptions, parse_argv
from topoplan.runner import threads
from topoplan.runner.builtin import checkpoint_folder, decode_bytes, encode_bytes
from topoplan.runner.compiled import compile_stage
from topoplan.runner.config import ModelConfig, check_tp, load_hf_config
from topoplan.runner.dist import Dist, init_dist, usable_dtype
from topoplan.runner.generate import Generation, Sampling, generate, micro_batch_rows
from topoplan.runner.graphs import cuda_graph_capture
from topoplan.runner.model import Shard, build_stage
from topoplan.runner.pipeline import Pipeline
from topoplan.runner.process import Progress, rank_main
from topoplan.runner.tiny import builtin_folder
from topoplan.runner.weights import load_stage_weights


def model_folder(model: str) -> Path:
    """A built-in model's cached folder (written on first use), or the user's checkpoint folder."""
    return checkpoint_folder(model) or builtin_folder(model)


Codec = tuple[Callable[[str], list[int]], Callable[[list[int]], str]]  # (encode, decode)


def tokenizer_for(folder: Path, config: ModelConfig, need_encode: bool) -> Codec | None:
    """(encode, decode) from tokenizer.json or the byte vocabulary; None when neither is usable."""
    if (folder / "tokenizer.json").exists():
        try:
            from tokenizers import Tokenizer  # optional: only checkpoints that ship a tokenizer need it
        except ImportError:
            if need_encode:
                raise TopoplanError(f"{folder}/tokenizer.json needs the 'tokenizers' package for --prompt text "
                                    "(pip install tokenizers), or pass --prompt-ids") from None
            return None

        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        return (lambda text: tokenizer.encode(text).ids), (lambda ids: tokenizer.decode(ids))
    if config.byte_tokenizer:
        return encode_bytes, decode_bytes
    return None


def prompts_of(opts: RunOptions, folder: Path, codec: Any, vocab_size: int) -> list[list[int]]:
    opts.validate()
    if opts.prompt and codec is None:
        raise TopoplanError(f"{folder} has no tokenizer.json: pass token ids with --prompt-ids 1,2,3")
    prompts = [codec[0](text) for text in opts.prompt] + opts.prompt_token_ids
    if any(not p for p in prompts):
        raise TopoplanError("a prompt encodes to no tokens")
    if max(max(p) for p in prompts) >= vocab_size:
        raise TopoplanError(f"prompt token id {max(max(p) for p in prompts)} is outside the model's vocabulary "
                            f"of {vocab_size}")
    return prompts


def shard_of(config: ModelConfig, d: Dist) -> Shard:
    """This rank's part of the model: its TP slice of the layers topoplan.layout.split_layers gives its stage
    (the split the planner priced)."""
    layers = split_layers(config.n_layers, d.layout.pp)[d.coords.pp_rank]
    return Shard(d.coords.tp_rank, d.layout.tp, layers, d.is_first_stage, d.is_last_stage, comm=d,
                 ep_rank=d.ep_rank, ep_size=d.layout.ep)


WARM_UP_TOKENS = threads.WARM_UP_STEPS + 1  # the prefill's token, then the steps of the tuner's first tries


def thread_tuner(opts: RunOptions, d: Dist) -> threads.ThreadTuner | None:
    """A thread tuner for a CPU rank of several threads whose step has no collective (tp = pp = ep = 1), unless
    --fixed-threads or --compile (topoplan.runner.threads)."""
    if opts.fixed_threads or opts.compile or d.device.type != "cpu" or max(d.layout.tp, d.layout.pp, d.layout.ep) > 1:
        return None
    count = torch.get_num_threads()
    return threads.ThreadTuner(count) if count > 1 else None


def run(opts: RunOptions, d: Dist, progress: Progress | None = None) -> dict[str, Any] | None:
    """Load, generate, gather. Returns the result dict on rank 0 (see docs/runner.md), None elsewhere."""
    progress = progress or Progress(False)
    layout, coords = d.layout, d.coords
    folder = model_folder(opts.model)
    config = load_hf_config(folder)
    if opts.cuda_graphs and config.n_experts:
        raise TopoplanError("--cuda-graphs: an MoE layer reads its experts' row counts on the host, which a CUDA "
                            "graph cannot record; run MoE checkpoints without it")
    if opts.cuda_graphs and d.device.type != "cuda":
        raise TopoplanError(f"--cuda-graphs records GPU kernels; this rank runs on {d.device.type} (backend "
                            f"{d.backend})")
    check_tp(config, layout.tp, source=str(layout), ep=layout.ep)
    dtype = usable_dtype(opts.dtype, d.device)
    codec = tokenizer_for(folder, config, need_encode=bool(opts.prompt))
    prompts = prompts_of(opts, folder, codec, config.vocab_size)
    mine = [i for i in range(len(prompts)) if i % layout.dp == coords.dp_rank]  # round-robin over replicas

    start = time.perf_counter()
    model = build_stage(config, shard_of(config, d), d.device, dtype)
    report = load_stage_weights(model, folder, config.tie_word_embeddings, on_tensor=progress.task("loading"))
    micro_batches = micro_batch_rows(len(mine), layout.pp, opts.micro_batches)  # the split generate makes
    kernel = model.pack_for_decode(max(1, max(r.stop - r.start for r in micro_batches)))
    load_s = time.perf_counter() - start
    if d.rank == 0 and not opts.json and progress.bar is None:
        print(f"topoplan-runner: {layout}: loaded in {load_s:.2f} s; generating {len(prompts)} prompt(s)",
              file=sys.stderr, flush=True)

    eos = () if opts.ignore_eos else config.eos_token_ids
    sampling = Sampling(opts.temperature, opts.top_p, opts.seed)

    # recorded in the warm-up, replayed by the timed generation (same shapes, same KV cache buffers)
    graphs = {"static_decode": True, "capture": cuda_graph_capture, "statics": {}} if opts.cuda_graphs else {}

    tuner = thread_tuner(opts, d)

    def generation(new_tokens: int, on_step: Callable[[int], None] | None = None, **extra: Any) -> Generation:
        def each_step(step: int) -> None:
            if tuner:
                tuner(step)
            if on_step:
                on_step(step)

        gen = generate(model, [prompts[i] for i in mine], new_tokens, eos_ids=eos, sampling=sampling,
                       pipeline=Pipeline(d, in_flight=len(micro_batches)), micro_batches=opts.micro_batches,
                       on_step=each_step, **graphs, **extra)
        if tuner:
            tuner.end()
        return gen

    compile_s = warm_up_s = 0.0
    if mine:  # a whole replica has prompts or none: its ranks warm up together
        cache_len = max(len(prompts[i]) for i in mine) + opts.max_new_tokens  # the real run's (generate)

        def warm_up() -> None:
            """Prefill and one decode step of the real batch, untimed (WARM_UP_TOKENS for a rank that tunes its
            threads: the tuner's first tries): a kernel's first call at a new shape (oneDNN creating its
            primitive, MKL its plan) costs ~1 ms, which an engine pays at start-up, not per request; the timed
            run then measures the steady state the planner prices."""
            generation(min(WARM_UP_TOKENS if tuner else 2, opts.max_new_tokens), cache_len=cache_len)

        if opts.compile:
            compile_s = compile_stage(model, warm_up)
        else:
            start = time.perf_counter()
            warm_up()
            warm_up_s = time.perf_counter() - start
    dist.barrier()  # every rank has loaded: prefill's clock must not count waiting for the slowest load
    d.timer.seconds = 0.0  # comm_ms counts generation only
    generating = progress.task("generating")
    gen = None
    if mine:  # a replica given no prompt only joins the final gather
        gen = generation(opts.max_new_tokens, keep_logits=opts.dump_logits is not None,
                         on_step=lambda s: generating(s + 1, opts.max_new_tokens))
    record = {
        "rank": d.rank, "coords": (coords.tp_rank, coords.pp_rank, coords.dp_rank), "indices": mine,
        "layers": [int(i) for i in model.layers],  # the decoder layers this rank built and ran
        "tokens": gen.tokens if gen else [], "prefill_s": gen.prefill_s if gen else 0.0,
        "decode_s": gen.decode_s if gen else 0.0, "decode_steps": gen.decode_steps if gen else 0,
        "comm_s": d.timer.seconds, "bytes_read": report.bytes_read, "files": report.files, "load_s": load_s,
        "compile_s": compile_s, "warm_up_s": warm_up_s,
        "cpu_kernel": {"kernel": ("onednn" if kernel.onednn else "mkl") if kernel.weights else None,
                       "mkl_ms": kernel.mkl_ms, "onednn_ms": kernel.onednn_ms},
        "cpu_threads": {"start": tuner.most, "end": tuner.count, "changes": tuner.changes} if tuner and mine else None,
        "logits": gen.logits if gen and gen.logits else None,
    }
    gathered: list[Any] | None = [None] * layout.world if d.rank == 0 else None
    dist.gather_object(record, gathered, dst=0)
    if d.rank != 0:
        return None
    return _assemble(opts, layout, str(dtype).removeprefix("torch."), len(prompts), gathered, codec)


def _assemble(opts: RunOptions, layout: Layout, dtype: str, n_prompts: int, records: list[dict[str, Any]],
              codec: Any) -> dict[str, Any]:
    """Rank 0: put each replica's tokens back in prompt order, check all ranks agree, summarise timings."""
    tokens: list[list[int] | None] = [None] * n_prompts
    logits: list[torch.Tensor | None] = [None] * n_prompts
    for rec in records:
        for i, seq in zip(rec["indices"], rec["tokens"]):
            if tokens[i] is None:
                tokens[i] = seq
            elif tokens[i] != seq:
                raise TopoplanError(f"rank {rec['rank']} ended with different tokens for prompt {i} than its "
                                    "replica's other ranks (TP ranks disagreed)")
        if rec["logits"] is not None and rec["coords"][0] == 0:
            for i, per_prompt in zip(rec["indices"], rec["logits"]):
                logits[i] = per_prompt
    busy = [rec["prefill_s"] + rec["decode_s"] for rec in records]
    decode = [rec["decode_s"] / rec["decode_steps"] for rec in records if rec["decode_steps"]]
    generated = sum(len(seq) for seq in tokens if seq)
    result = {
        "layout": {"tp": layout.tp, "pp": layout.pp, "dp": layout.dp, "ep": layout.ep},
        "stages": stages_run(layout, records),
        "dtype": dtype,  # what ran: float32 when the backend could not reduce the requested dtype
        "tokens": tokens,
        "text": [codec[1](seq) for seq in tokens] if codec else None,
        "timing": {
            "prefill_ms": 1000 * max(rec["prefill_s"] for rec in records),
            "decode_ms_per_token": 1000 * max(decode) if decode else None,
            "tokens_per_s": generated / max(busy) if max(busy) > 0 else None,
            "comm_ms": 1000 * max(rec["comm_s"] for rec in records),
            "comm_ms_per_rank": [1000 * rec["comm_s"] for rec in records],
            "load_s_per_rank": [rec["load_s"] for rec in records],
            "warm_up_s_per_rank": [rec["warm_up_s"] for rec in records],
            **({"compile_s_per_rank": [rec["compile_s"] for rec in records]} if opts.compile else {}),
        },
        "bytes_read_per_rank": [rec["bytes_read"] for rec in records],
        "files_read_per_rank": [rec["files"] for rec in records],
        "cpu_kernel_per_rank": [rec["cpu_kernel"] for rec in records],
        "cpu_threads_per_rank": [rec["cpu_threads"] for rec in records],
    }
    if opts.dump_logits:
        with atomic_path(opts.dump_logits) as tmp:
            torch.save(logits, tmp)
    return result


def stages_run(layout: Layout, records: list[dict[str, Any]]) -> list[dict[str, int]]:
    """Each pipeline stage's layers as its ranks built them (the shape of `plan --json`'s "stages"); every
    rank of a stage must hold the same contiguous layers."""
    stages = []
    for pp_rank in range(layout.pp):
        held = {tuple(rec["layers"]) for rec in records if rec["coords"][1] == pp_rank}
        if len(held) != 1:
            raise TopoplanError(f"the ranks of pipeline stage {pp_rank} built different layers: {sorted(held)}")
        (layers,) = held
        if list(layers) != list(range(layers[0], layers[-1] + 1)):
            raise TopoplanError(f"pipeline stage {pp_rank} ran layers {list(layers)}, not a contiguous range")
        stages.append(layers)
    return layer_split_json(stages)


def render_text(result: dict[str, Any]) -> str:
    lines = []
    for i, seq in enumerate(result["tokens"]):
        shown = repr(result["text"][i]) if result["text"] is not None else ",".join(map(str, seq))
        lines.append(f"[{i}] {shown}")
    t = result["timing"]
    mb = max(result["bytes_read_per_rank"]) / 1e6
    decode = f"{t['decode_ms_per_token']:.2f} ms/token" if t["decode_ms_per_token"] is not None else "no decode steps"
    lines.append(f"tp={result['layout']['tp']} pp={result['layout']['pp']} dp={result['layout']['dp']}: "
                 f"prefill {t['prefill_ms']:.1f} ms, decode {decode}, {t['tokens_per_s']:.1f} tokens/s, "
                 f"comm {t['comm_ms']:.1f} ms, read {mb:.1f} MB (largest rank)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Entry point of every rank (topoplan.runner.process.rank_main: one-line errors, exit 2 or 1, no hang)."""
    opts = parse_argv(argv)

    def body(env: RankEnv) -> str | None:
        d = init_dist(env, opts.layout, opts.backend, opts.timeout, shared_memory=not opts.no_shared_memory)
        with Progress.on_rank(d.rank, quiet=opts.json) as progress:
            result = run(opts, d, progress)
        if result is None:
            return None
        return json.dumps(result) if opts.json else render_text(result)

    rank_main("topoplan-runner", body)
