"""Random hostile cases for the CLI, shared by tests/test_fuzz_cli.py (hypothesis draws the seed, bounded
examples) and benchmarks/fuzz_sweep.py (10,000+ seeds): a seed -> the argv and the files it reads.

Each case starts from real input (a bundled paste or NVML recording, a Llama config, a calibration) and
damages it the ways the reliability sweep found: huge or negative numbers, wrong types, NaN, deep nesting,
junk characters, deleted or duplicated lines, options at and beyond their ranges."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import random
import sys
import time
import traceback
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

from hostile_inputs import DGX, LLAMA, PASTES, RECORDINGS

HOSTILE_VALUES = [-1, -5, 0, 1, 2**31, 2**64, 10**30, -(10**30), 0.5, -0.0, 1e308, "4", "", "abc", "NaN", True, False,
                  None, [], [1, 2], {}, {"a": [1]}, [[[[[]]]]], "9" * 50, "x" * 10_000]
RAW_TOKENS = ["NaN", "Infinity", "-Infinity", "1e400", "9" * 5000, "[" * 200 + "]" * 200, "[" * 5000]
JUNK = ["NV" + "9" * 5000, "NV0", "NV-1", "SYS", "X", "\x00", "\x1b[4m", "é", "N/A", "-1", "99999999999", "\t\t",
        "GPU0", "NIC0", "0-7,", "0-", "65536", "  ", "|", "legend:", "NIC Legend:", "NIC0: mlx5_0", "CPU Affinity"]
OPTION_VALUES = ["0", "-1", "1", "3", "7", "8", "1024", "4097", "100000", "9" * 5000, "inf", "nan", "-inf", "1e308",
                 "", " ", "abc", "tp=2", "tp=0", "tp=3,pp=2", "pp=99999", "tp=" + "9" * 5000, "a,b,a", "-rf", "1,x",
                 "1:0", "4K:1K", "0K", "64G", "65G"]
PLAN_OPTIONS = ["--batch", "--prompt-len", "--gen-len", "--nodes", "--tp", "--pp", "--dp", "--max-tp", "--nic-gbps",
                "--top", "--objective", "--dtype", "--gpu"]
LAUNCH_OPTIONS = ["--layout", "--rank", "--nodes", "--hosts", "--port", "--prompt-ids", "--checkpoint", "--format"]
SPAWNING_OPTIONS = {"run": ["--tp", "--pp", "--dp", "--max-new-tokens", "--timeout", "--prompt-ids", "--seed",
                            "--temperature", "--top-p", "--dtype", "--backend"],
                    "bench": ["--sizes", "--ranks", "--iters", "--warmup", "--timeout", "--layout", "--ops", "--dtype"]}


@dataclass
class Case:
    kind: str
    argv: list[str]
    files: dict[str, str | bytes]  # name -> content, written into a fresh folder; "{dir}" in argv is that folder


def _mutate_text(rng: random.Random, text: str) -> str:
    lines = text.split("\n")
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(lines))
        action = rng.choice(["junk", "junk", "delete", "duplicate", "truncate", "detab", "cell"])
        if action == "junk":
            cut = rng.randint(0, len(lines[i]))
            lines[i] = lines[i][:cut] + rng.choice(JUNK) + lines[i][cut:]
        elif action == "delete" and len(lines) > 1:
            del lines[i]
        elif action == "duplicate":
            lines.insert(i, lines[i])
        elif action == "truncate":
            lines[i] = lines[i][:rng.randint(0, len(lines[i]))]
        elif action == "detab":
            lines[i] = lines[i].replace("\t", " ")
        else:
            cells = lines[i].split("\t")
            cells[rng.randrange(len(cells))] = rng.choice(JUNK)
            lines[i] = "\t".join(cells)
    return "\n".join(lines)


def _mutate_json(rng: random.Random, data: object) -> str:
    """The JSON text of `data` after one to three values somewhere inside are replaced by hostile ones."""
    for _ in range(rng.randint(1, 3)):
        node, path = data, []
        while isinstance(node, (dict, list)) and node and rng.random() < 0.8:
            key = rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node))
            path.append((node, key))
            node = node[key]
        if not path:
            break
        parent, key = path[-1]
        parent[key] = copy.deepcopy(rng.choice(HOSTILE_VALUES))
    text = json.dumps(data)
    if rng.random() < 0.2:  # raw tokens Python's json.dumps never writes
        token = rng.choice(RAW_TOKENS)
        text = text.replace(": ", f": {token}, \"_x\": ", 1) if ": " in text else token
    return text


def make_case(seed: int) -> Case:
    rng = random.Random(seed)
    kind = rng.choice(["paste", "paste", "recording", "config", "calibration", "plan-options", "launch-options",
                       "spawning-options"])
    if kind == "paste":
        text = _mutate_text(rng, rng.choice(PASTES).read_text())
        command = rng.choice([["inspect", "--file", "{dir}/topo.txt", "--json"],
                              ["plan", "--model", "8b", "--topo", "{dir}/topo.txt", "--gpu", "a100-80gb", "--json"]])
        return Case(kind, command, {"topo.txt": text})
    if kind == "recording":
        text = _mutate_json(rng, json.loads(rng.choice(RECORDINGS).read_text()))
        return Case(kind, ["inspect", "--file", "{dir}/rec.json", "--json"], {"rec.json": text})
    if kind == "config":
        config = {**LLAMA, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                            "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
                  "eos_token_id": [1, 2], "tie_word_embeddings": False, "rms_norm_eps": 1e-5}
        text = _mutate_json(rng, config)
        files = {"model/config.json": text}
        if rng.random() < 0.3:
            files["model/generation_config.json"] = _mutate_json(rng, {"eos_token_id": [1], "do_sample": False})
        command = rng.choice([["plan", "--model", "{dir}/model", "--topo", str(DGX), "--gpu", "a100-80gb", "--json"],
                              ["run", "--model", "{dir}/model", "--prompt-ids", "1,2", "--max-new-tokens", "2"]])
        return Case(kind, command, files)
    if kind == "calibration":
        calibration = {"version": 1, "links": {"nvlink": {"alpha_us": 5.0, "bandwidth_gbps": 200.0},
                                               "pcie": {"alpha_us": 10.0}},
                       "collective_base_us": 8.0, "layer_overhead_us": 20.0, "step_overhead_us": 100.0}
        text = _mutate_json(rng, calibration)
        return Case(kind, ["plan", "--model", "70b", "--topo", str(DGX), "--gpu", "a100-80gb", "--json",
                           "--calibration", "{dir}/cal.json"], {"cal.json": text})
    if kind == "plan-options":
        argv = ["plan", "--model", rng.choice(["70b", "8b", "tiny-nonexistent"]), "--topo", str(DGX), "--json"]
        for option in rng.sample(PLAN_OPTIONS, rng.randint(1, 3)):
            argv += [option, rng.choice(OPTION_VALUES + ["a100-80gb", "fp8", "throughput", "bf16"])]
        return Case(kind, argv, {})
    if kind == "launch-options":
        argv = ["launch", "--topo", str(DGX), "--gpu", "a100-80gb", "--model", "70b"]
        for option in rng.sample(LAUNCH_OPTIONS, rng.randint(1, 3)):
            argv += [option, rng.choice(OPTION_VALUES + ["shell", "json", "slurm", "h1,h2", "h1,h1"])]
        if "--layout" not in argv and "--rank" not in argv:
            argv += ["--layout", "tp=8"]
        return Case(kind, argv, {})
    command = rng.choice(list(SPAWNING_OPTIONS))
    argv = [command] + (["--prompt-ids", "1,2"] if command == "run" else [])
    for option in rng.sample(SPAWNING_OPTIONS[command], rng.randint(1, 3)):
        argv += [option, rng.choice(OPTION_VALUES + ["gloo", "nccl", "float32", "all_reduce", "bogus"])]
    return Case("spawning-options", argv, {})


class WouldSpawn(Exception):
    """Raised by the stand-in for spawn_ranks: the input passed every check made before ranks start."""


def no_ranks(*args: object, **kwargs: object) -> None:
    raise WouldSpawn


def materialise(case: Case, folder: Path) -> list[str]:
    """Write the case's files under `folder`; its argv with {dir} filled in."""
    for name, content in case.files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, errors="surrogatepass")
    return [arg.replace("{dir}", str(folder)) for arg in case.argv]


MEMORY_BUDGET = 256 * 2**20  # bytes of Python allocations per input (docs/limits.md)
TIME_BUDGET = 10.0  # seconds per input, generous for a loaded 2-core CI runner


@dataclass
class Outcome:
    """What one CLI run in-process did."""

    code: object  # the exit code; None when an exception other than SystemExit escaped
    out: str
    err: str
    seconds: float
    peak: int  # bytes: the peak of Python allocations (tracemalloc)
    traceback: str | None = None


def run_within_budget(argv: list[str]) -> Outcome:
    """Run `topoplan argv` in this process (spawn_ranks must already be replaced by `no_ranks`), measuring its
    time and peak allocations; an input that reaches spawning counts as accepted (exit 0)."""
    from topoplan import cli

    saved, sys.argv = sys.argv, ["topoplan", *argv]
    out, err, tb = io.StringIO(), io.StringIO(), None
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            cli.main()
        code: object = 0
    except SystemExit as exit_:
        code = exit_.code
    except WouldSpawn:
        code = 0
    except BaseException:  # noqa: BLE001 - a traceback is what the callers count
        code, tb = None, traceback.format_exc()
    finally:
        seconds = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        sys.argv = saved
    return Outcome(code, out.getvalue(), err.getvalue(), seconds, peak, tb)


def broken(outcome: Outcome) -> list[str]:
    """The classes of docs/limits.md's contract this outcome breaks (none: it kept it)."""
    problems = []
    if outcome.traceback is not None or "Traceback" in outcome.err:
        problems.append("traceback")
    elif outcome.code not in (0, 2):
        problems.append(f"exit {outcome.code}")
    lines = [line for line in outcome.err.splitlines() if not line.startswith("topoplan: warning:")]
    if outcome.code == 2 and (len(lines) != 1 or not lines[0].startswith("topoplan: error: ")):
        problems.append("error of more than one line")
    if outcome.seconds > TIME_BUDGET:
        problems.append("over 10 s")
    if outcome.peak > MEMORY_BUDGET:
        problems.append("over 256 MiB")
    if any(c in outcome.out + outcome.err for c in "\x1b\x07\x9b\x9d"):
        problems.append("raw escape in output")
    return problems
