"""`--explain`: every variable of every rank with its reason, and the binding, as rich tables."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from topoplan.launch.binding import MEM_POLICIES, describe_cpus
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
        table.add_row("numactl --cpunodebind" if r.cpus is None and r.cpu_node is not None
                      else "numactl --physcpubind", describe_cpus(r.cpus, r.cpu_node), r.cpu_reason)
        option = MEM_POLICIES[r.mem_policy][0]
        table.add_row(f"numactl {option or '(no memory policy)'}" if r.mem_node is not None or option is None
                      else "numactl --localalloc", str(r.mem_node) if r.mem_node is not None else "", r.mem_reason)
        tables.append(table)
    emit(console, *tables, *(f"note: {note}" for note in spec.notes))
