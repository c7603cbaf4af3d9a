"""One rank of tests/test_shm.py: the shared-memory collectives against gloo's on the same inputs.
Usage: python tests/shm_harness.py OUT_DIR (rank env from the spawner). Rank r writes OUT_DIR/r.json."""

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from topoplan.rank_env import discover_rank_env
from topoplan.runner.dist import join_world
from topoplan.runner.shm import SHM_DIR, ShmChannels, ShmGroup, usable


def main() -> None:
    out = Path(sys.argv[1])
    join_world(discover_rank_env(), "gloo", 60)
    rank, world = dist.get_rank(), dist.get_world_size()
    before = set(os.listdir(SHM_DIR))
    group = dist.new_group(list(range(world)))
    shm = ShmGroup(group, timeout_s=60, capacity=4096)
    dist.barrier()
    leftover = sorted(name for name in set(os.listdir(SHM_DIR)) - before if name.startswith("topoplan-"))
    generator = torch.Generator().manual_seed(rank)
    same, gathered_ok = [], []
    for call in range(7):  # more calls than parities: slots are reused; shapes repeat: their views are kept
        x = torch.randn(3, 5 + call % 3, generator=generator)
        expected = x.clone()
        dist.all_reduce(expected, group=group)
        got = shm.all_reduce(x.clone())
        same.append(torch.allclose(got, expected, rtol=1e-6, atol=1e-6))
        parts = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(parts, x, group=group)
        gathered_ok.append(torch.equal(shm.all_gather(x, dim=-1), torch.cat(parts, dim=-1)))
    # all_to_all with uneven counts (member i sends i + j + 1 rows to member j, one sends none), against gloo's
    counts = [[(i + j + 1) * (i != 1 or j != 0) for j in range(world)] for i in range(world)]
    rows = torch.randn(sum(counts[rank]), 3, generator=generator)
    expected = torch.empty(sum(sent[rank] for sent in counts), 3)
    dist.all_to_all_single(expected, rows, [sent[rank] for sent in counts], counts[rank], group=group)
    exchanged = shm.all_to_all_fits(counts, rows) and torch.equal(shm.all_to_all(rows, counts), expected)
    reduced = shm.all_reduce(torch.randn(64, generator=generator))
    everyone: list = [None] * world
    dist.all_gather_object(everyone, reduced.tolist(), group=group)
    result = {"usable": usable(group, torch.device("cpu")), "leftover": leftover, "same": same,
              "gathered": gathered_ok, "bitwise_equal_on_every_rank": all(r == everyone[0] for r in everyone),
              "fits": [shm.fits(torch.empty(1024)), shm.fits(torch.empty(1025))], "all_to_all": exchanged,
              "all_to_all_too_big": shm.all_to_all_fits([[200, 200]] * world, torch.empty(0, 3))}
    result["channels"] = channels(group, rank)
    (out / f"{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def channels(group, rank: int) -> dict:
    """Members 0 and 1: 0 sends 2 * SLOTS messages to 1 before 1 reads any (so 0 waits on a full channel), then
    1 answers on its own channel; every message's meta and payload checked, one payload too big for a slot
    sent by gloo after its message. Other members only build the channels."""
    slots = 3
    pipe = ShmChannels(group, [(0, 1), (1, 0)], timeout_s=60, slots=slots, capacity=4096)
    payloads = [torch.arange(n, dtype=torch.float32) * (n + 1) for n in (1, 5, 1023, 1024, 1100, 7)]
    ok = []
    if rank in (0, 1):
        for direction in (0, 1):
            sender = direction
            messages = [(k, payloads[k % len(payloads)]) for k in range(2 * slots)] + [(99, None)]
            if rank == sender:
                for k, payload in messages:
                    travelled = pipe.send(direction, [k, -k, 7], payload)
                    ok.append(travelled == (payload is None or payload.numel() * 4 <= 4096))
                    if not travelled:
                        dist.send(payload, 1 - sender)
            else:
                time.sleep(0.5)  # the sender fills every slot and waits
                for k, payload in messages:
                    meta, got = pipe.receive(direction)
                    if got is None and payload is not None:
                        got = torch.empty_like(payload)
                        dist.recv(got, sender)
                        ok.append(meta == [k, -k, 7] and torch.equal(got, payload))
                    else:
                        ok.append(meta == [k, -k, 7] and (payload is None) == (got is None)
                                  and (got is None or torch.equal(got.view(torch.float32), payload)))
    dist.barrier()
    return {"all_ok": all(ok), "checked": len(ok)}


if __name__ == "__main__":
    main()
