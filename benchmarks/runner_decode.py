"""Decode speed of the bundled runner against HF transformers `generate`, and TP/PP against TP1.

Prints ratios against named references; asserts nothing. Every ratio compares runs with the same number
of CPU threads in total (OMP_NUM_THREADS / torch.set_num_threads). Timings are decode only:
  ours  the runner's own `decode_ms_per_token` (wall time of the decode steps, rank 0's view), from
        `python -m topoplan.runner --json --ignore-eos` started through topoplan.runner.spawn;
  HF    (generate(N+1 new tokens) - generate(1 new token)) / N, in this process, greedy, no EOS stop,
        best of --repeat.
Weight bandwidth: bytes of weights a decode step streams (all but the embedding table, of which it reads
one row per token) x tokens/s, against the rate at which this process reads every weight once
(torch.sum over each weight tensor, same thread count, best of --repeat).

    python benchmarks/runner_decode.py [--tokens 64] [--threads 1] [--repeat 3]
    python benchmarks/runner_decode.py --cuda     # on a GPU: TP1 on NCCL vs HF on the same GPU
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from topoplan.runner.options import RunOptions  # noqa: E402
from topoplan.runner.spawn import spawn_ranks  # noqa: E402
from topoplan.runner.tiny import builtin_folder  # noqa: E402


def ours(model: str, tokens: int, threads: int, repeat: int, tp: int = 1, pp: int = 1, backend: str = "gloo") -> dict:
    """Best (lowest decode ms/token) of `repeat` runs of the runner on tp*pp local ranks."""
    opts = RunOptions(model=model, tp=tp, pp=pp, prompt_ids=["256,72,101,108,108,111"], max_new_tokens=tokens + 1,
                      ignore_eos=True, json=True, backend=backend)
    best = None
    for _ in range(repeat):
        result = spawn_ranks(tp * pp, [sys.executable, "-m", "topoplan.runner", *opts.to_argv()],
                             env_per_rank=lambda r: {"OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)},
                             capture_stdout=True, echo=False, timeout_s=900)
        if result.returncode:
            raise SystemExit("\n".join(result.stderr[-20:]))
        timing = json.loads(result.stdout)["timing"]
        if best is None or timing["decode_ms_per_token"] < best["decode_ms_per_token"]:
            best = timing
    best["comm_ms_per_token"] = best["comm_ms"] / (tokens + 1)  # comm_ms covers prefill and every decode step
    return best


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def hf_decode_ms(folder: Path, tokens: int, repeat: int, device: torch.device) -> float:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(device).eval()
    ids = torch.tensor([[256, 72, 101, 108, 108, 111]], device=device)

    def timed(n: int) -> float:
        sync(device)
        start = time.perf_counter()
        model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=258)
        sync(device)
        return time.perf_counter() - start

    timed(2)  # warm-up
    return 1000 * min(timed(tokens + 1) - timed(1) for _ in range(repeat)) / tokens


def weight_stream(folder: Path, repeat: int, device: torch.device) -> tuple[int, float]:
    """(bytes a decode step streams, seconds this process needs to read those weights once)."""
    from safetensors.torch import load_file

    tensors = load_file(folder / "model.safetensors")
    weights = [t.to(device) for name, t in tensors.items() if "embed_tokens" not in name]
    nbytes = sum(t.numel() * t.element_size() for t in weights)
    best = float("inf")
    for _ in range(repeat + 1):
        sync(device)
        start = time.perf_counter()
        for t in weights:
            t.sum()
        sync(device)
        best = min(best, time.perf_counter() - start)
    return nbytes, best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="threads per side for the TP1 vs HF ratios")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cuda", action="store_true", help="TP1 on NCCL and HF on GPU 0; skips the CPU TP/PP part")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device("cuda", 0) if args.cuda else torch.device("cpu")
    backend = "nccl" if args.cuda else "gloo"
    where = torch.cuda.get_device_name(0) if args.cuda else f"{os.cpu_count()} CPUs"
    print(f"host: {where}, load average {os.getloadavg()[0]:.2f} (shared machines make every figure noisy), "
          f"torch {torch.__version__}, {args.tokens} decode tokens, best of {args.repeat}")

    print(f"\n== TP1 ({backend}) vs HF transformers generate ({device.type}), {args.threads} CPU thread(s) each ==")
    for name in ("tiny", "small"):
        folder = builtin_folder(name)
        mine = ours(name, args.tokens, args.threads, args.repeat, backend=backend)
        hf_ms = hf_decode_ms(folder, args.tokens, args.repeat, device)
        print(f"{name:6s} ours {mine['decode_ms_per_token']:7.2f} ms/token ({1000 / mine['decode_ms_per_token']:7.1f} "
              f"tok/s)  HF {hf_ms:7.2f} ms/token ({1000 / hf_ms:7.1f} tok/s)  ours/HF tok/s = "
              f"{hf_ms / mine['decode_ms_per_token']:.2f}x")
        if name == "small":
            nbytes, read_s = weight_stream(folder, args.repeat, device)
            achieved = nbytes / (mine["decode_ms_per_token"] / 1000)
            print(f"small  weights streamed per token {nbytes / 1e6:.0f} MB: achieved {achieved / 1e9:.2f} GB/s vs "
                  f"read-once {nbytes / read_s / 1e9:.2f} GB/s = {achieved * read_s / nbytes:.0%} "
                  f"(HF: {nbytes / (hf_ms / 1000) * read_s / nbytes:.0%})")

    if args.cuda:
        return
    print("\n== 2 processes x 1 thread (TP2, PP2) vs TP1 on 2 threads ==")
    for name in ("tiny", "small"):
        base = ours(name, args.tokens, 2, args.repeat)
        line = f"{name:6s} TP1x2thr {base['decode_ms_per_token']:7.2f} ms/token"
        for label, tp, pp in (("TP2", 2, 1), ("PP2", 1, 2)):
            got = ours(name, args.tokens, 1, args.repeat, tp=tp, pp=pp)
            line += (f" | {label} {got['decode_ms_per_token']:7.2f} ms/token, comm {got['comm_ms_per_token']:6.2f} "
                     f"ms/token, speed vs TP1 {base['decode_ms_per_token'] / got['decode_ms_per_token']:.2f}x")
        print(line)


if __name__ == "__main__":
    main()
