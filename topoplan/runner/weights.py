"""Load one rank's shard of an HF safetensors checkpoint, reading only the bytes that shard needs.

The checkpoint's index (`model.safetensors.index.json`, or the header of a single `*.safetensors`) says
which file holds each tensor. A rank opens only the files holding its stage's tensors and reads each
through `safe_open(...).get_slice`, which copies just the requested rows or columns out of the
memory-mapped file. `LoadReport.bytes_read` counts the bytes of those slices in the checkpoint's dtype
(the operating system may touch a little more: whole pages around a slice).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from topoplan.errors import TopoplanError
from topoplan.runner.layers import Source, sources

INDEX_NAME = "model.safetensors.index.json"


@dataclass
class LoadReport:
    """What one rank read: bytes of tensor data and the files it opened."""

    bytes_read: int = 0
    files: list[str] = field(default_factory=list)


def checkpoint_index(folder: str | Path) -> dict[str, str]:
    """Tensor name -> file name, from the index JSON or the one safetensors file's header."""
    folder = Path(folder)
    index_path = folder / INDEX_NAME
    if index_path.exists():
        try:
            weight_map = json.loads(index_path.read_text())["weight_map"]
        except json.JSONDecodeError as error:
            raise TopoplanError(f"invalid JSON: {error.msg}", source=index_path, line=error.lineno) from None
        except KeyError:
            raise TopoplanError("missing key 'weight_map'", source=index_path) from None
        return dict(weight_map)
    files = sorted(folder.glob("*.safetensors"))
    if len(files) != 1:
        raise TopoplanError(f"expected {INDEX_NAME} or exactly one *.safetensors file, found {len(files)}",
                            source=folder)
    with safe_open(files[0], framework="pt") as f:
        return {name: files[0].name for name in f.keys()}


def hf_name(local_name: str) -> str:
    """Our tensor names are HF's without the `model.` prefix the decoder body carries there."""
    return local_name if local_name.startswith("lm_head.") else f"model.{local_name}"


Target = tuple[str, torch.Tensor, Source]  # HF tensor name, local parameter, which slice goes where


def _targets(model: nn.Module, index: dict[str, str], tied: bool) -> dict[str, list[Target]]:
    """file -> every (HF tensor, parameter, slice) this stage needs from it."""
    by_file: dict[str, list[Target]] = defaultdict(list)
    seen: set[int] = set()
    for module_name, module in model.named_modules():
        for param_name, param in module.named_parameters(recurse=False):
            if id(param) in seen:
                continue  # a tied head shares the embedding tensor: load it once
            seen.add(id(param))
            for source in sources(module_name, module, param_name):
                name = hf_name(source.name)
                if name == "lm_head.weight" and tied and name not in index:
                    name = "model.embed_tokens.weight"  # tied checkpoints store only the embedding
                if name not in index:
                    raise TopoplanError(f"the checkpoint has no tensor {name!r}")
                by_file[index[name]].append((name, param, source))
    return by_file


def load_stage_weights(model: nn.Module, folder: str | Path, tied: bool,
                       on_tensor: Callable[[int, int], None] | None = None) -> LoadReport:
    """Fill every parameter of `model` (one stage, one TP rank) from the checkpoint in `folder`.

    `on_tensor(done, total)` is called after each tensor read (progress bars)."""
    folder = Path(folder)
    report = LoadReport()
    targets = _targets(model, checkpoint_index(folder), tied)
    total, done = sum(len(items) for items in targets.values()), 0
    for file_name, items in sorted(targets.items()):
        path = folder / file_name
        if not path.exists():
            raise TopoplanError("not found (listed in the checkpoint index)", source=path)
        report.files.append(file_name)
        with safe_open(path, framework="pt", device="cpu") as f:
            for name, param, source in items:
                tensor = _read(f.get_slice(name), name, param, source, path)
                destination = param if source.dim != 0 else param.narrow(0, source.offset, len(source.index))
                with torch.no_grad():
                    destination.copy_(tensor)
                report.bytes_read += tensor.numel() * tensor.element_size()
                done += 1
                if on_tensor:
                    on_tensor(done, total)
    return report


def _read(view, name: str, param: torch.Tensor, source: Source, path: Path) -> torch.Tensor:
    """Read `source`'s slice of tensor `name`, after checking the tensor's global shape."""
    shape = tuple(view.get_shape())
    expected = list(param.shape)
    if source.dim is not None:
        expected[source.dim] = source.full_size
    if shape != tuple(expected):
        raise TopoplanError(f"tensor {name!r} has shape {list(shape)}, expected {expected} from config.json",
                            source=path)
    if source.dim is None:
        return view[:]
    index = source.index
    return view[index.start:index.stop] if source.dim == 0 else view[:, index.start:index.stop]
