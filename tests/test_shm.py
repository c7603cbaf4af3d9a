"""topoplan.runner.shm on real processes: the shared-memory all-reduce and all-gather give what gloo gives,
bit-identical on every rank, and leave no file in /dev/shm; the pipeline channels deliver every message in
order. (The runner's TP and PP layouts use them by default; tests/test_runner_dist.py checks their tokens and
logits against one rank, and over gloo.)"""

import json
import platform
import sys
from pathlib import Path

import pytest

from topoplan.runner.spawn import spawn_ranks

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("world", [2, 3])
def test_shared_memory_collectives_match_gloo(tmp_path, world):
    result = spawn_ranks(world, [sys.executable, str(ROOT / "tests" / "shm_harness.py"), str(tmp_path)],
                         env_per_rank=lambda r: {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)},
                         timeout_s=120, capture_stdout=True, echo=False)
    assert result.returncode == 0, "\n".join(result.stderr[-30:])
    for rank in range(world):
        got = json.loads((tmp_path / f"{rank}.json").read_text())
        assert got["usable"] is (platform.machine() in ("x86_64", "AMD64"))  # one host; TSO stores only
        assert got["leftover"] == []  # the segment's name is gone once every rank has mapped it
        assert got["same"] == [True] * 7 and got["gathered"] == [True] * 7
        assert got["bitwise_equal_on_every_rank"] is True
        assert got["fits"] == [True, False]  # 4096 bytes per slot: 1024 fp32 fit, 1025 go through gloo
        assert got["all_to_all"] is True  # uneven splits, a member sending none, the same rows as gloo's
        assert got["all_to_all_too_big"] is False  # 400 rows x 12 bytes > 4096: even a member sending no rows says so
        # pipeline channels: every message in order, intact, past a full channel; one payload by gloo
        assert got["channels"] == {"all_ok": True, "checked": 14 if rank < 2 else 0}
