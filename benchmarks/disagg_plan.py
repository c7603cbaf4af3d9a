"""How long `plan --disagg` takes on one 8-GPU node (issue 35's budget: 100 ms), and on two nodes.

Times the library call `disagg_for` (the normal plan it compares with included: reading the paste, pricing every
aggregated layout, the per-role layouts, the P:D search, placing the best candidates), best of a few runs, wall
and CPU time of this process, each as a ratio to the 100 ms budget, with the load average (the machine is
shared). No CLI start-up.

    python benchmarks/disagg_plan.py
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from topoplan.plan.cost import Workload  # noqa: E402
from topoplan.plan.disagg import disagg_for  # noqa: E402
from topoplan.plan.frontend import PlanRequest  # noqa: E402
from topoplan.plan.rank import Limits  # noqa: E402

H200 = str(ROOT / "fixtures" / "topo" / "41_h200-8gpu-nv18-10nic-container-cpuset-empty-affinity.txt")
DGX_A100 = str(ROOT / "fixtures" / "topo" / "00_dgx-a100-8gpu-nv12-10nic-gpu-rows-only.txt")
BUDGET_S = 0.100
LIMITS = Limits(2000, 50)
CASES = (
    ("1 x 8 H200, Llama-3.1-70B, sglang, both limits",
     PlanRequest(model="70b", topo=H200, gpu="h200", engine="sglang", limits=LIMITS,
                 workload=Workload(prompt_len=2048, gen_len=256))),
    ("1 x 8 A100, Llama-3.1-70B, vllm, both limits",
     PlanRequest(model="70b", topo=DGX_A100, gpu="a100-80gb", engine="vllm", limits=LIMITS,
                 workload=Workload(prompt_len=2048, gen_len=256))),
    ("2 x 8 H200, DeepSeek-V3 fp8, sglang, both limits",
     PlanRequest(model="DeepSeek-V3", topo=H200, gpu="h200", engine="sglang", nodes=2, limits=LIMITS,
                 workload=Workload(prompt_len=2048, gen_len=256, dtype="fp8"))),
)


def main() -> None:
    for label, request in CASES:
        runs = []
        for _ in range(5):
            wall, cpu = time.perf_counter(), time.process_time()
            result = disagg_for(request)
            runs.append((time.perf_counter() - wall, time.process_time() - cpu))
        walls, cpus = sorted(r[0] for r in runs), sorted(r[1] for r in runs)
        print(f"{label}: wall {walls[0] * 1e3:.0f}-{walls[-1] * 1e3:.0f} ms ({walls[0] / BUDGET_S:.2f} x the 100 ms "
              f"budget at best), CPU {cpus[0] * 1e3:.0f}-{cpus[-1] * 1e3:.0f} ms ({cpus[0] / BUDGET_S:.2f} x); "
              f"searched {result.searched}, chosen {result.chosen.ratio[0]}P:{result.chosen.ratio[1]}D")
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
