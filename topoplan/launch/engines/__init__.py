"""The serving engines' command lines: `topoplan launch --engine vllm|sglang|trtllm`.

One module per engine turns a LaunchSpec (layout, placement, binding, NCCL variables) into that engine's own
command per node and says how the engine maps its workers to visible devices; topoplan.launch.engines.scripts
writes them as a shell script, Slurm lines or JSON. The bundled runner (`--engine topoplan`) keeps the per-rank
launchers of topoplan.launch.formats. What each engine is (versions, parallelism rules) is its profile in
topoplan.engines, whose Engine names the module here that writes its command line (Engine.launcher).
"""

from __future__ import annotations

from importlib import import_module

from topoplan.engines import Engine, versions
from topoplan.engines.engine import version_tuple
from topoplan.errors import TopoplanError
from topoplan.launch.engines.common import EngineLaunch, ServeOptions
from topoplan.launch.spec import LaunchSpec
from topoplan.layout import RankGrid


def check_engine(engine: Engine, spec: LaunchSpec) -> None:
    """The engine version must have a command line here (Engine.launcher) and run the layout's parallelisms."""
    check_release(engine)
    rules, layout = engine.parallelism, spec.layout
    for degree, allowed in (("tp", rules.tp), ("pp", rules.pp), ("dp", rules.runs(layout, layout.ep > 1))):
        if getattr(layout, degree) > 1 and not allowed:
            raise TopoplanError(f"{engine} does not run {degree} > 1 ({layout})")
    if not rules.tp_across_nodes and any(len({spec.ranks[r].node for r in group}) > 1
                                         for group in RankGrid(layout).tp_groups):
        raise TopoplanError(f"{engine} keeps a TP group on one node; {layout} spreads one over nodes")


def check_release(engine: Engine) -> None:
    """The engine version must be the release whose options launch writes (checked against its parser)."""
    if engine.launcher is None:
        launchable = ", ".join(f"{e} ({e.covers[0]}-{e.covers[1]})" for e in versions(engine.name) if e.launcher)
        raise TopoplanError(f"--engine {engine}: launch writes no command line for {engine.name} "
                            f"{engine.covers[0]}-{engine.covers[1]} (its options differ); launch writes "
                            f"{launchable or 'none'}, and `plan` prices {engine}")
    if engine.pinned and engine.launch_release and not _same_release(engine.pinned, engine.launch_release):
        raise TopoplanError(f"--engine {engine.name}@{engine.pinned}: launch writes {engine.name} "
                            f"{engine.launch_release}'s options (checked against its own parser), and "
                            f"{engine.pinned} may lack some it writes (binding, multi-node, DP options): upgrade, or "
                            "pass --engine "
                            f"{engine.name}@{engine.launch_release} (`plan` prices {engine} for {engine.pinned})")


def _same_release(asked: str, written: str) -> bool:
    """Whether a pinned version is the release the lines are written for (`0.32`, `0.32.0`, `0.32.1` are 0.32)."""
    want, have = version_tuple(asked), version_tuple(written)
    return bool(want and have) and want[:len(have)] == have  # type: ignore[index]


def engine_launch(engine: Engine, spec: LaunchSpec, options: ServeOptions) -> EngineLaunch:
    """The engine's launch for this spec: one command per node (TRT-LLM over nodes: per-rank MPI), written by
    the module its Engine names (topoplan.launch.engines.<launcher>)."""
    if not engine.serves:
        raise TopoplanError(f"--engine {engine}: not a serving engine (the bundled runner gets per-rank lines)")
    check_engine(engine, spec)
    return import_module(f"{__name__}.{engine.launcher}").engine_launch(engine, spec, options)
