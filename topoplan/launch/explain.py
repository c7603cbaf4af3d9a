"""`--explain`: every variable of every rank with its reason, and the binding, as rich tables."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from topoplan.cpuset import format_cpu_list
from topoplan.launch.binding import MEM_POLICIES, describe_cpus
from topoplan.launch.engines.common import EngineLaunch, Option
from topoplan.launch.nccl_env import EnvVar
from topoplan.launch.spec import LaunchSpec
from topoplan.terminal import emit, inert

if TYPE_CHECKING:
    from topoplan.launch.engines.disagg import DisaggLaunch


def explain(spec: LaunchSpec, console: Console) -> None:
    """Printed at the console's width: long values fold onto more lines rather than being cut."""
    tables: list[Table | str] = []
    for r in spec.ranks:
        table = Table(title=inert(f"rank {r.rank}: node {r.node}, local rank {r.local_rank}, {r.gpu} "
                                  f"(tp={r.tp_rank} pp={r.pp_rank} dp={r.dp_rank})"), title_justify="left")
        table.add_column("variable", overflow="fold")
        table.add_column("value", overflow="fold")
        table.add_column("why", overflow="fold", ratio=1)
        for var in r.env:
            table.add_row(inert(var.name), inert(var.value), inert(var.reason))
        table.add_row("numactl --cpunodebind" if r.cpus is None and r.cpu_node is not None
                      else "numactl --physcpubind", describe_cpus(r.cpus, r.cpu_node), inert(r.cpu_reason))
        option = MEM_POLICIES[r.mem_policy][0]
        table.add_row(f"numactl {option or '(no memory policy)'}" if r.mem_node is not None or option is None
                      else "numactl --localalloc", "" if r.mem_node is None else str(r.mem_node), inert(r.mem_reason))
        tables.append(table)
    emit(console, *tables, *(f"note: {note}" for note in spec.notes))


def explain_engine(launch: EngineLaunch, console: Console) -> None:
    """A serving engine's launch: per node its variables and the engine options topoplan chose, with reasons, and
    where each rank is placed."""
    out: list[Table | str] = [launch.device_mapping]
    for command in launch.nodes:
        out.append(_reasons(f"node {command.node}" + (" (serves HTTP)" if command.serves else " (workers only)"),
                            command.env, command.options))
    for r in launch.spec.ranks:
        cpus = format_cpu_list(r.cpus) if r.cpus is not None else "-"
        out.append(f"rank {r.rank} (tp={r.tp_rank} pp={r.pp_rank} dp={r.dp_rank}): node {r.node}, local rank "
                   f"{r.local_rank} -> {r.gpu}, CPUs {cpus}")
    emit(console, *out, *(f"note: {note}" for note in (*launch.notes, *launch.spec.notes)))


def _reasons(title: str, env: Sequence[EnvVar], options: Sequence[Option]) -> Table:
    """One process's variables and engine options, each with its reason."""
    table = Table(title=inert(title), title_justify="left")
    table.add_column("variable / option", overflow="fold")
    table.add_column("value", overflow="fold")
    table.add_column("why", overflow="fold", ratio=1)
    for var in env:
        table.add_row(inert(var.name), inert(var.value), inert(var.reason))
    for option in options:
        table.add_row(inert(option.words[0]), inert(" ".join(option.words[1:])), inert(option.reason))
    return table


def explain_disagg(launch: DisaggLaunch, console: Console) -> None:
    """A disaggregated launch: per worker and the router, its variables and options with their reasons."""
    tables = [_reasons(f"{p.name}: node {p.node}" + (f", GPUs {','.join(p.gpus)}" if p.gpus else "") +
                       f", HTTP {p.port}", p.env, p.options) for p in launch.processes]
    emit(console, *tables, f"router: {inert(launch.router_label)}", *(f"note: {inert(n)}" for n in launch.notes))
