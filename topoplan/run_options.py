"""The runner's options: one dataclass, parsed from argv by rank processes and turned back into argv by
`topoplan run` (and benchmarks), so both sides always agree. Imports no torch: the CLI uses it cheaply."""

from __future__ import annotations

import argparse
import operator
from dataclasses import dataclass, field, fields

from topoplan.dtypes import RUN_DTYPES, checked_dtype
from topoplan.errors import TopoplanError
from topoplan.layout import Layout
from topoplan.limits import check_count
from topoplan.option_fields import option


def parse_ids(text: str) -> list[int]:
    """`1,2,3` -> [1, 2, 3]."""
    try:
        ids = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise TopoplanError(f"--prompt-ids {text!r}: expected comma-separated token ids like 1,2,3") from None
    if not ids or min(ids) < 0:
        raise TopoplanError(f"--prompt-ids {text!r}: expected at least one non-negative token id")
    return ids


BACKENDS = ("nccl", "gloo")
SEED_MAX = 2**64 - 1  # torch.manual_seed's range
MAX_TIMEOUT_S = 86_400.0  # one day: longer than any rendezvous or collective should wait; inf overflows C timeouts


def check_common(*, backend: str | None, dtype: str, dtypes: tuple[str, ...], timeout: float) -> None:
    """The checks `run` and `bench` share: refused in the parent, before any rank starts."""
    if backend is not None and backend not in BACKENDS:
        raise TopoplanError(f"--backend {backend!r}: expected {' or '.join(BACKENDS)}")
    checked_dtype(dtype, dtypes)
    if not 0 < timeout <= MAX_TIMEOUT_S:
        raise TopoplanError(f"--timeout {timeout:g}: expected a positive number of seconds, at most {MAX_TIMEOUT_S:g} "
                            f"(one day)")


@dataclass(frozen=True)
class RunOptions:
    """The run request: built by `topoplan run` (its options are these fields', topoplan.option_fields) and by
    validate and benchmarks, checked by `validate` (and, with the model in hand, topoplan.runner.local.check_run)
    before any rank starts, and handed to every rank as argv (`to_argv` / `parse_argv`, so both sides always
    agree)."""

    model: str = field(default="tiny", metadata=option("--model", "-m", help="Built-in model (tiny, small) or an HF "
                                                       "checkpoint folder."))
    tp: int = field(default=1, metadata=option(help="Tensor-parallel degree."))
    pp: int = field(default=1, metadata=option(help="Pipeline stages."))
    dp: int = field(default=1, metadata=option(help="Data-parallel replicas (each takes a share of the prompts)."))
    ep: int = field(default=1, metadata=option(help="MoE checkpoints: split the experts over this many ranks of each "
                                               "TP group (must divide --tp; tokens travel by all-to-all)."))
    prompt: list[str] = field(default_factory=list, metadata=option(help="Prompt text (repeat for a batch); needs "
                                                                    "tokenizer.json or a built-in model."))
    prompt_ids: list[str] = field(default_factory=list, metadata=option(help="Prompt as token ids, e.g. 1,2,3 (repeat "
                                                                        "for a batch)."))  # "1,2,3" per prompt
    max_new_tokens: int = field(default=32, metadata=option(help="Tokens to generate per prompt (fewer if EOS comes "
                                                            "first)."))
    dtype: str = field(default="float32", metadata=option(help="float32, bfloat16 or float16."))
    backend: str | None = field(default=None, metadata=option(help="nccl or gloo (default: nccl when CUDA is "
                                                              "available)."))
    timeout: float = field(default=300.0, metadata=option(help="Seconds to wait for the rendezvous and for any "
                                                          "collective."))
    temperature: float = field(default=0.0, metadata=option(help="0 is greedy."))
    top_p: float = field(default=1.0, metadata=option(help="Nucleus sampling threshold (with --temperature)."))
    seed: int = field(default=0, metadata=option(help="Sampling seed (the same on every rank)."))
    ignore_eos: bool = field(default=False, metadata=option("--ignore-eos", help="Always generate --max-new-tokens "
                                                            "(benchmarks)."))
    json: bool = field(default=False, metadata=option("--json", help="Print one JSON object (see docs/runner.md); no "
                                                      "progress bar."))
    dump_logits: str | None = None  # rank 0 writes each step's logits here (torch.save), for checking
    # pipeline micro-batches in flight: 0 = min(pp, batch), the planner's schedule; 1 = none
    micro_batches: int = field(default=0, metadata=option("--micro-batches", help="Pipeline micro-batches in flight "
                                                          "(0: one per stage, the schedule `plan` prices; 1: none)."))
    # TP/EP collectives, PP messages by gloo even on one host (runner.shm); the command line says it the other way
    no_shared_memory: bool = field(default=False, metadata=option(
        "--shared-memory/--no-shared-memory", default=True, parse=operator.not_, help="TP and EP collectives and "
        "pipeline messages between CPU ranks of one host through shared memory (else gloo's sockets)."))
    compile: bool = field(default=False, metadata=option(  # the stage's forward under torch.compile (runner.compiled)
        "--compile", help="Compile each stage's forward with torch.compile before generating (fewer, fused kernels "
        "per decode step; tens of seconds of start-up, reported as compile_s; docs/runner.md)."))
    cuda_graphs: bool = field(default=False, metadata=option(  # decode steps replayed (topoplan.runner.graphs)
        "--cuda-graphs", help="GPUs: record each micro-batch's decode step once as a CUDA graph and replay it every "
        "step (fixed-shape step over the whole KV cache; docs/runner.md)."))
    fixed_threads: bool = field(default=False, metadata=option(  # default: topoplan.runner.threads
        "--fixed-threads", help="CPU: keep each rank's threads at its cores' count (else a rank with no collective in "
        "its step, TP, PP and EP 1, runs one thread fewer while another process slows it; docs/runner.md)."))

    def to_argv(self) -> list[str]:
        """The argv that `parse_argv` turns back into these options."""
        argv: list[str] = []
        for f in fields(self):
            value, flag = getattr(self, f.name), "--" + f.name.replace("_", "-")
            if isinstance(value, bool):
                argv += [flag] if value else []
            elif isinstance(value, list):  # `--flag=value`: a value starting with "-" is not read as an option
                argv += [f"{flag}={item}" for item in value]
            elif value is not None:
                argv.append(f"{flag}={value}")
        return argv

    @property
    def layout(self) -> Layout:
        return Layout(self.tp, self.pp, self.dp, self.ep)

    @property
    def prompt_token_ids(self) -> list[list[int]]:
        return [parse_ids(text) for text in self.prompt_ids]

    def validate(self) -> None:
        """Checks that need no model: a prompt is given, ids parse, counts and sampling settings are in range."""
        check_common(backend=self.backend, dtype=self.dtype, dtypes=RUN_DTYPES, timeout=self.timeout)
        if not self.temperature >= 0:
            raise TopoplanError(f"--temperature {self.temperature:g}: expected 0 (greedy) or more")
        if not 0 < self.top_p <= 1:
            raise TopoplanError(f"--top-p {self.top_p:g}: expected a probability mass in (0, 1]")
        if not 0 <= self.seed <= SEED_MAX:
            raise TopoplanError(f"--seed {self.seed}: expected 0 to 2**64-1")
        check_count("--micro-batches", self.micro_batches)  # 0: one per stage
        check_count("--max-new-tokens", self.max_new_tokens)
        if self.cuda_graphs and self.compile:
            raise TopoplanError("--cuda-graphs and --compile: pick one (a compiled step is not recorded as a graph "
                                "here; docs/runner.md)")
        if self.cuda_graphs and self.backend == "gloo":
            raise TopoplanError("--cuda-graphs records GPU kernels: it needs the nccl backend, not gloo")
        if not self.prompt and not self.prompt_ids:
            raise TopoplanError("no prompt: pass --prompt TEXT or --prompt-ids 1,2,3 (repeat for a batch)")
        self.prompt_token_ids  # parses, raising on a malformed list


def parse_argv(argv: list[str] | None = None) -> RunOptions:
    parser = argparse.ArgumentParser(prog="python -m topoplan.runner",
                                     description="One rank of the topoplan sharded inference runner.")
    defaults = RunOptions()
    for f in fields(RunOptions):
        flag, value = "--" + f.name.replace("_", "-"), getattr(defaults, f.name)
        if isinstance(value, bool):
            parser.add_argument(flag, action="store_true")
        elif isinstance(value, list):
            parser.add_argument(flag, action="append", default=[])
        else:
            kind = type(value) if value is not None else str
            parser.add_argument(flag, type=kind, default=value)
    return RunOptions(**vars(parser.parse_args(argv)))
