"""`--explain`: every variable of every rank with its reason, and the binding, as rich tables."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from topoplan.launch.binding import MEM_POLICIES, describe_cpus
from topoplan.launch.spec import LaunchSpec


def explain(spec: LaunchSpec, console: Console) -> None:
    for r in spec.ranks:
        table = Table(title=f"rank {r.rank}: node {r.node}, local rank {r.local_rank}, {r.gpu} "
                            f"(tp={r.tp_rank} pp={r.pp_rank} dp={r.dp_rank})", title_justify="left")
        table.add_column("variable")
        table.add_column("value")
        table.add_column("why")
        for var in r.env:
            table.add_row(var.name, var.value, var.reason)
        table.add_row("numactl --cpunodebind" if r.cpus is None and r.cpu_node is not None
                      else "numactl --physcpubind", describe_cpus(r.cpus, r.cpu_node), r.cpu_reason)
        option = MEM_POLICIES[r.mem_policy][0]
        table.add_row(f"numactl {option or '(no memory policy)'}" if r.mem_node is not None or option is None
                      else "numactl --localalloc", str(r.mem_node) if r.mem_node is not None else "", r.mem_reason)
        console.print(table)
    for note in spec.notes:
        console.print(f"note: {note}")
