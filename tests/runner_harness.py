"""One rank of a multi-job test launch: join the world once, then run each job (its own layout and groups)
through the runner's real `run`. Usage: python tests/runner_harness.py JOBS.json OUT_DIR (rank env from
the spawner). Rank 0 writes OUT_DIR/<job name>.json; any failure ends the rank non-zero."""

import json
import sys
from pathlib import Path

import torch.distributed as dist

from topoplan.rank_env import discover_rank_env
from topoplan.run_options import RunOptions
from topoplan.runner.dist import build_dist, join_world
from topoplan.runner.worker import run

TIMEOUT_S = 120


def main() -> None:
    jobs = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    backend, device = join_world(discover_rank_env(), "gloo", TIMEOUT_S)
    for job in jobs:
        opts = RunOptions(**job["options"])
        d = build_dist(opts.layout, backend, device, TIMEOUT_S)
        result = run(opts, d)
        if result is not None:
            (out / f"{job['name']}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
