"""Part of a machine: the GPUs a job may use (`plan --gpus 4,5,6,7`), for a shared node or one with a broken GPU.

The subset keeps each GPU's id and index (GPU4 stays GPU4, so CUDA_VISIBLE_DEVICES names the physical GPUs),
the links among the kept GPUs, and every NIC with its links to them: planning on it is planning on a
machine of those GPUs. Independent of any request type so that `plan` and `launch` read `--gpus` alike.
"""

from __future__ import annotations

from topoplan.errors import TopoplanError
from topoplan.topology.model import Topology

MAX_SPEC_CHARS = 4096  # a GPU list longer than this is not a list of one machine's GPUs


def parse_gpus(text: str, topology: Topology) -> list[str]:
    """`4,5,6,7`, `4-7`, `GPU4,GPU6` (indexes as nvidia-smi numbers them, ranges inclusive) -> GPU ids in
    the machine's order; a one-line error for an empty list, a GPU the machine lacks, or one named twice."""
    option = "--gpus"
    if len(text) > MAX_SPEC_CHARS:
        raise TopoplanError(f"{option}: a list of {len(text)} characters is not one machine's GPUs")
    count = len(topology.gpus)
    have = f"this machine has GPU0-GPU{count - 1}" if count else "this machine has no GPUs"
    chosen: list[int] = []
    for item in (part.strip() for part in text.split(",")):
        first, dash, last = item.removeprefix("GPU").partition("-")
        last = last.removeprefix("GPU")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise TopoplanError(f"{option} {text!r:.60}: expected GPU indexes like 4,5,6,7 or 4-7, got {item!r:.20}")
        low, high = int(first), int(last) if dash else int(first)
        if low > high or high >= count:
            raise TopoplanError(f"{option} {item}: no such GPU ({have})")
        chosen.extend(range(low, high + 1))
    twice = sorted({i for i in chosen if chosen.count(i) > 1})
    if twice:
        raise TopoplanError(f"{option} names GPU{twice[0]} twice")
    return [g.id for g in topology.gpus if g.index in set(chosen)]


def gpu_subset(topology: Topology, text: str) -> Topology:
    """The machine reduced to the GPUs `text` names (parse_gpus), with a note saying which."""
    keep = set(parse_gpus(text, topology))
    gpus = [g for g in topology.gpus if g.id in keep]
    nics = {n.id for n in topology.nics}
    links = [link for link in topology.links()
             if all(end in keep or end in nics for end in (link.a, link.b))]
    note = f"--gpus {text}: planned on {', '.join(g.id for g in gpus)} of {len(topology.gpus)} GPUs"
    return Topology(gpus, topology.nics, links, arch=topology.arch, gpu_name=topology.gpu_name,
                    source=topology.source, notes=(*topology.notes, note), cpu=topology.cpu, vendor=topology.vendor)
