"""The serving engines' command lines: `topoplan launch --engine vllm|sglang|trtllm`.

One module per engine turns a LaunchSpec (layout, placement, binding, NCCL variables) into that engine's own
command per node and says how the engine maps its workers to visible devices; topoplan.launch.engines.render
writes them as a shell script, Slurm lines or JSON. The bundled runner (`--engine topoplan`) keeps the per-rank
launchers of topoplan.launch.render. Each module writes the options of one engine version, named in
LAUNCH_VERSIONS; what each engine is for the planner lives in topoplan.engines.
"""

from __future__ import annotations

from collections.abc import Callable

from topoplan.engines import EngineId
from topoplan.errors import TopoplanError
from topoplan.launch.engines import sglang, trtllm, vllm
from topoplan.launch.engines.common import EngineLaunch, ServeOptions
from topoplan.launch.spec import LaunchSpec

LAUNCHERS: dict[str, Callable[[LaunchSpec, ServeOptions], EngineLaunch]] = {
    "vllm": vllm.engine_launch, "sglang": sglang.engine_launch, "trtllm": trtllm.engine_launch,
}
# The version whose options each module writes (and whose option list the tests check the lines against).
LAUNCH_VERSIONS = {"vllm": "0.32", "sglang": "0.5.23", "trtllm": "1.2"}


def check_launch_version(engine: EngineId) -> None:
    """Refuse `--engine NAME@VERSION` for a version whose command line this module does not write."""
    wanted = LAUNCH_VERSIONS.get(engine.name)
    if engine.version is not None and wanted is not None and not wanted.startswith(engine.version) \
            and not engine.version.startswith(wanted):
        raise TopoplanError(f"--engine {engine}: launch writes {engine.name} {wanted}'s command line; options of "
                            f"other versions differ, so pass --engine {engine.name} (plan prices older versions)")


def engine_launch(engine: EngineId, spec: LaunchSpec, options: ServeOptions) -> EngineLaunch:
    """The engine's launch for this spec: one command per node (TRT-LLM over nodes: per-rank MPI)."""
    if engine.name not in LAUNCHERS:
        raise TopoplanError(f"--engine {engine}: not a serving engine; expected one of {', '.join(LAUNCHERS)}")
    check_launch_version(engine)
    return LAUNCHERS[engine.name](spec, options)
