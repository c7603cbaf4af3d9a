"""`--explain`: every variable of every rank with its reason, and the binding, as rich tables."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from topoplan.cpuset import format_cpu_list
from topoplan.launch.spec import LaunchSpec
from topoplan.terminal import emit


def explain(spec: LaunchSpec, console: Console) -> None:
    """Printed at the console's width: long values fold onto more lines rather than being cut."""
    tables: list[Table | str] = []
    for r in spec.ranks:
        table = Table(title=f"rank {r.rank}: node {r.node}, local rank {r.local_rank}, {r.gpu} "
                            f"(tp={r.tp_rank} pp={r.pp_rank} dp={r.dp_rank})", title_justify="left")
        table.add_column("variable", overflow="fold")
        table.add_column("value", overflow="fold")
        table.add_column("why", overflow="fold", ratio=1)
        for var in r.env:
            table.add_row(var.name, var.value, var.reason)
        cpus = format_cpu_list(r.cpus) if r.cpus is not None else "(not bound)"
        table.add_row("numactl --physcpubind", cpus, "CPUs from the GPU's affinity, split between the ranks sharing "
                      "it, whole physical cores first")
        table.add_row("numactl --membind" if r.mem_node is not None else "numactl --localalloc",
                      str(r.mem_node) if r.mem_node is not None else "", r.mem_reason)
        tables.append(table)
    emit(console, *tables, *(f"note: {note}" for note in spec.notes))
