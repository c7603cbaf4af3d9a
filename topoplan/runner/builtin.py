"""The built-in models' configs and byte-level tokenisation (no torch here: the CLI checks runs with it).

`tiny` is for demos and tests (per-token overhead dominates); `small` (about 370 MB of fp32 weights) is
large enough that decode is bound by memory bandwidth on a CPU. Token ids 0-255 are bytes, so no
tokenizer is needed; 256 is BOS, 257 EOS, 258 padding. topoplan.runner.tiny writes their random weights.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from topoplan.errors import TopoplanError
from topoplan.models import BUILTIN_MODELS, CATALOG

BOS, EOS, PAD = 256, 257, 258

# The sizes (vocabulary included) are the planner's catalog entries, so `plan -m tiny` prices what runs;
# these are the keys only the runner reads.
_RUNTIME: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "hidden_act": "silu", "bos_token_id": BOS, "eos_token_id": EOS,
    "pad_token_id": PAD, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "torch_dtype": "float32",
    "topoplan_byte_tokenizer": True, "max_position_embeddings": 4096,
}
BUILTIN: dict[str, dict[str, Any]] = {name: {**_RUNTIME, **CATALOG[name]} for name in BUILTIN_MODELS}
SEED = 0
# Bump when topoplan.runner.tiny.random_weights changes what a seed produces: cached folders built by the
# old recipe then no longer match their definition and are rebuilt.
WEIGHTS_RECIPE = 1
BUILD_RECORD = "topoplan-build.json"  # written last into a cached folder: what it was built from


def checkpoint_folder(model: str) -> Path | None:
    """The one reading of the runner's `--model`: None for a built-in name (its folder is written on first
    use, topoplan.runner.tiny.builtin_folder), else the HF checkpoint folder it must name."""
    if model in BUILTIN:
        return None
    folder = Path(model)
    try:
        found = folder.is_dir()
    except OSError as error:  # a name too long for the file system, a loop of links
        raise TopoplanError(f"--model {model!r}: {error.strerror}; expected an HF checkpoint folder or one of "
                            f"{', '.join(BUILTIN)}") from None
    if not found:
        raise TopoplanError(f"--model {model!r}: not a folder; expected an HF checkpoint folder or one of "
                            f"{', '.join(BUILTIN)}")
    return folder


def builtin_cache_folder(name: str) -> Path:
    """Where built-in model `name` is written on first use: $TOPOPLAN_CACHE/models, else the user cache
    ($XDG_CACHE_HOME/topoplan/models, else ~/.cache/topoplan/models)."""
    if name not in BUILTIN:
        raise TopoplanError(f"unknown built-in model {name!r}; expected one of {', '.join(BUILTIN)} or a folder")
    own = os.environ.get("TOPOPLAN_CACHE")
    root = Path(own) if own else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "topoplan"
    return root / "models" / f"{name}-seed{SEED}"


def builtin_definition(name: str) -> dict[str, Any]:
    """Everything the cached folder of built-in `name` is made from: its config, the seed, the recipe."""
    return {"config": BUILTIN[name], "seed": SEED, "weights_recipe": WEIGHTS_RECIPE}


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def definition_digest(name: str) -> str:
    return _digest(json.dumps(builtin_definition(name), sort_keys=True).encode())


def build_record(name: str, folder: Path) -> dict[str, Any]:
    """The record written last into a freshly built folder: the definition's digest, config.json's digest and
    the weights' size (a size, not a digest: hashing `small`'s 380 MB on every run costs more than a load)."""
    return {"model": name, "definition_sha256": definition_digest(name),
            "config_sha256": _digest((folder / "config.json").read_bytes()),
            "weights_bytes": (folder / "model.safetensors").stat().st_size}


def cache_mismatch(name: str, folder: Path) -> str | None:
    """Why the cached folder is not built-in `name` as defined now, in a few words; None when it is.

    Checked on every use (a few small reads): a folder left by an older topoplan, an interrupted build, or a
    hand-edited or truncated file is rebuilt instead of failing later with a shape error."""
    if not folder.is_dir():
        return "it is missing"
    try:
        record = json.loads((folder / BUILD_RECORD).read_text())
    except (OSError, ValueError):
        return f"it has no readable {BUILD_RECORD} (an interrupted build, or an older topoplan)"
    if not isinstance(record, dict) or record.get("definition_sha256") != definition_digest(name):
        return f"it was built from another definition of {name}"
    try:
        config_sha, weights_bytes = _digest((folder / "config.json").read_bytes()), \
            (folder / "model.safetensors").stat().st_size
    except OSError as error:
        return f"{Path(error.filename or '?').name} is unreadable ({error.strerror})"
    if config_sha != record.get("config_sha256"):
        return "its config.json changed after it was built"
    if weights_bytes != record.get("weights_bytes"):
        return f"its model.safetensors has {weights_bytes} bytes, {record.get('weights_bytes')} were written"
    return None


def encode_bytes(text: str) -> list[int]:
    """Byte-level tokenisation of the built-in models: BOS then the UTF-8 bytes."""
    return [BOS, *text.encode("utf-8")]


def decode_bytes(ids: list[int]) -> str:
    """Bytes back to text; special ids are dropped."""
    return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")
