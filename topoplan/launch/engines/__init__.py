"""The serving engines' command lines: `topoplan launch --engine vllm|sglang|trtllm`.

One module per engine turns a LaunchSpec (layout, placement, binding, NCCL variables) into that engine's own
command per node and says how the engine maps its workers to visible devices; topoplan.launch.engines.render
writes them as a shell script, Slurm lines or JSON. The bundled runner (`--engine topoplan`) keeps the per-rank
launchers of topoplan.launch.render. What each engine is (versions, parallelism rules) is its profile in
topoplan.engines; the modules here write the options of its newest profile's version.
"""

from __future__ import annotations

from collections.abc import Callable

from topoplan.engines import EngineId, resolve
from topoplan.errors import TopoplanError
from topoplan.launch.engines import sglang, trtllm, vllm
from topoplan.launch.engines.common import EngineLaunch, ServeOptions
from topoplan.launch.spec import LaunchSpec
from topoplan.layout import RankGrid

LAUNCHERS: dict[str, Callable[[LaunchSpec, ServeOptions], EngineLaunch]] = {
    "vllm": vllm.engine_launch, "sglang": sglang.engine_launch, "trtllm": trtllm.engine_launch,
}


def check_engine(engine: EngineId, spec: LaunchSpec) -> None:
    """The engine's profile (topoplan.engines) must be its newest, whose command line the modules here write,
    and must run the layout's parallelisms."""
    profile, newest = resolve(engine), resolve(EngineId(engine.name))
    if profile is not newest:
        raise TopoplanError(f"--engine {engine}: launch writes the command line of {newest} ({engine.name} "
                            f"{newest.covers[0]}-{newest.covers[1]}); options of older versions differ, so pass "
                            f"--engine {engine.name} (`plan` prices {profile})")
    rules, layout = profile.parallelism, spec.layout
    for degree, allowed in (("tp", rules.tp), ("pp", rules.pp), ("dp", rules.dp)):
        if getattr(layout, degree) > 1 and not allowed:
            raise TopoplanError(f"{profile} does not run {degree} > 1 ({layout})")
    if not rules.tp_across_nodes and any(len({spec.ranks[r].node for r in group}) > 1
                                         for group in _tp_groups(spec)):
        raise TopoplanError(f"{profile} keeps a TP group on one node; {layout} spreads one over nodes")


def _tp_groups(spec: LaunchSpec) -> list[list[int]]:
    return RankGrid(spec.layout).tp_groups


def engine_launch(engine: EngineId, spec: LaunchSpec, options: ServeOptions) -> EngineLaunch:
    """The engine's launch for this spec: one command per node (TRT-LLM over nodes: per-rank MPI)."""
    if engine.name not in LAUNCHERS:
        raise TopoplanError(f"--engine {engine}: not a serving engine; expected one of {', '.join(LAUNCHERS)}")
    check_engine(engine, spec)
    return LAUNCHERS[engine.name](spec, options)
