#!/usr/bin/env bash
# One short GPU check of bench and calibrate (run from the repository root on a CUDA machine; ~2 minutes).
# Prints nccl-tests-style sweeps over every local GPU with NCCL, then writes a calibration from the GPU
# probes (memory bandwidth, GEMV, GEMM in bf16, the runner's per-layer overhead) and one link class per
# GPU pair type, and shows what the planner makes of it. With one GPU, sendrecv is skipped (it needs two
# ranks) and no link class is measured: only the probes calibrate.
set -euo pipefail
out="${OUT:-/tmp}"
nvidia-smi --query-gpu=name,memory.total --format=csv
python -m topoplan bench --backend nccl --sizes 4K:256M --iters 20 --warmup 5 --plot "$out/busbw.svg"
python -m topoplan bench --backend nccl --sizes 4K:256M --iters 20 --warmup 5 --json > "$out/bench.json"
python -m topoplan calibrate --out "$out/calibration.json" --dtype bf16
python - "$out/calibration.json" <<'PY'
import json, sys
cal = json.load(open(sys.argv[1]))
print(json.dumps({k: cal[k] for k in ("memory_bandwidth_efficiency", "flop_efficiency", "layer_overhead_us")}))
print(json.dumps(cal.get("gpu"), indent=1))
PY
python benchmarks/bench_overhead.py --iters 50 --rounds 5
