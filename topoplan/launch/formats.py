"""Pick the renderer for a --format."""

from __future__ import annotations

from collections.abc import Callable

from topoplan.errors import TopoplanError
from topoplan.launch.render_json import render_json
from topoplan.launch.render_mpirun import render_mpirun
from topoplan.launch.render_shell import render_shell
from topoplan.launch.render_slurm import render_sbatch, render_srun
from topoplan.launch.render_torchrun import render_torchrun
from topoplan.launch.spec import LaunchSpec

RENDERERS: dict[str, Callable[[LaunchSpec], str]] = {
    "torchrun": render_torchrun, "mpirun": render_mpirun, "srun": render_srun, "sbatch": render_sbatch,
    "shell": render_shell, "json": render_json,
}
ENGINE_ONLY_FORMATS = ("lws",)  # a serving engine's launch alone (topoplan.launch.engines.scripts)
FORMATS = tuple(RENDERERS)


def render(spec: LaunchSpec, fmt: str) -> str:
    if fmt in ENGINE_ONLY_FORMATS:
        raise TopoplanError("--format lws is for serving engines (--engine vllm|sglang|trtllm): a LeaderWorkerSet "
                            "keeps a server up and restarts it, while the bundled runner runs once and exits; run it "
                            "in a Kubernetes Job with the torchrun lines")
    if fmt not in RENDERERS:
        raise TopoplanError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
    return RENDERERS[fmt](spec)
