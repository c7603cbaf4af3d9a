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
from topoplan.runner.layers import weight_slice

INDEX_NAME = "model.safetensors.index.json"


@dataclass
class LoadReport:
    """What one rank read: bytes of tensor data, the files it opened, and how many tensors."""

    bytes_read: int = 0
    files: list[str] = field(default_factory=list)
    tensors: int = 0


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
    """Our parameter names are HF's without the `model.` prefix the decoder body carries there."""
    return local_name if local_name.startswith("lm_head.") else f"model.{local_name}"


def _targets(model: nn.Module, index: dict[str, str], tied: bool) -> dict[str, list[tuple[str, nn.Module, str]]]:
    """file -> [(tensor name, owning module, parameter name)] for every parameter of this stage."""
    by_file: dict[str, list[tuple[str, nn.Module, str]]] = defaultdict(list)
    seen: set[int] = set()
    for module_name, module in model.named_modules():
        for param_name, param in module.named_parameters(recurse=False):
            if id(param) in seen:
                continue  # a tied head shares the embedding tensor: load it once
            seen.add(id(param))
            name = hf_name(f"{module_name}.{param_name}")
            if name == "lm_head.weight" and tied and name not in index:
                name = "model.embed_tokens.weight"  # tied checkpoints store only the embedding
            if name not in index:
                raise TopoplanError(f"the checkpoint has no tensor {name!r}")
            by_file[index[name]].append((name, module, param_name))
    return by_file


def load_stage_weights(model: nn.Module, folder: str | Path, tied: bool,
                       on_tensor: Callable[[int], None] | None = None) -> LoadReport:
    """Fill every parameter of `model` (one stage, one TP rank) from the checkpoint in `folder`.

    `on_tensor(nbytes)` is called after each tensor (progress bars)."""
    folder = Path(folder)
    report = LoadReport()
    for file_name, items in sorted(_targets(model, checkpoint_index(folder), tied).items()):
        path = folder / file_name
        if not path.exists():
            raise TopoplanError("not found (listed in the checkpoint index)", source=path)
        report.files.append(file_name)
        with safe_open(path, framework="pt", device="cpu") as f:
            for name, module, param_name in items:
                param = getattr(module, param_name)
                tensor = _read(f.get_slice(name), name, tuple(param.shape), weight_slice(module, param_name), path)
                with torch.no_grad():
                    param.copy_(tensor)
                nbytes = tensor.numel() * tensor.element_size()
                report.bytes_read += nbytes
                report.tensors += 1
                if on_tensor:
                    on_tensor(nbytes)
    return report


def _read(view, name: str, local_shape: tuple[int, ...], spec: tuple[int, range, int] | None,
          path: Path) -> torch.Tensor:
    """Read the slice `spec` of tensor `name`, after checking its global shape."""
    shape = tuple(view.get_shape())
    expected = list(local_shape)
    if spec is not None:
        expected[spec[0]] = spec[2]
    if shape != tuple(expected):
        raise TopoplanError(f"tensor {name!r} has shape {list(shape)}, expected {expected} from config.json",
                            source=path)
    if spec is None:
        return view[:]
    dim, rows, _ = spec
    return view[rows.start:rows.stop] if dim == 0 else view[:, rows.start:rows.stop]
