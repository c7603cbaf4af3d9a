"""Hostile inputs shared by the regression tests and the fuzz sweep (benchmarks/fuzz_sweep.py): text and JSON a
user (or a damaged file) can hand topoplan, built from the bundled real pastes and recordings."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOPO = ROOT / "fixtures" / "topo"
DGX = TOPO / "00_dgx-a100-8gpu-nv12-10nic-gpu-rows-only.txt"
PASTES = sorted([*(p for p in TOPO.glob("*.txt") if ".measured" not in p.name and ".p2p" not in p.name),
                 *(ROOT / "fixtures" / "amd").glob("*.txt"), *(ROOT / "fixtures" / "nccl").glob("*.xml")])
RECORDINGS = sorted((ROOT / "fixtures" / "nvml").glob("*.json"))
HUGE = "9" * 5000  # past Python's 4,300-digit int-string limit
LLAMA = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
         "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 256}

# (what, config.json text): each must be refused by name with exit 2, in `plan` and in `run`
BAD_CONFIGS = [
    ("kv heads as text", json.dumps({**LLAMA, "num_key_value_heads": "4"})),
    ("head_dim as text", json.dumps({**LLAMA, "head_dim": "16"})),
    ("negative head_dim", json.dumps({**LLAMA, "head_dim": -16})),
    ("hidden_size true", json.dumps({**LLAMA, "hidden_size": True})),
    ("huge vocab", json.dumps(LLAMA)[:-1] + f', "vocab_size": 1{"0" * 400}}}'),
    ("float overflow", json.dumps(LLAMA)[:-1] + ', "rms_norm_eps": 1e400}'),
    ("eps as text", json.dumps({**LLAMA, "rms_norm_eps": "abc"})),
    ("rope_scaling a list", json.dumps({**LLAMA, "rope_scaling": [1, 2]})),
    ("a bare string", '"llama"'),
    ("NaN", json.dumps(LLAMA)[:-1] + ', "rope_theta": NaN}'),
    ("deep nesting", "[" * 100_000),
]


def paste_with(old: str, new: str, count: int = 1) -> str:
    """The DGX A100 paste with `old` replaced by `new` (the first `count` times)."""
    text = DGX.read_text()
    assert old in text
    return text.replace(old, new, count)
