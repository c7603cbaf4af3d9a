"""Point-to-point activation passing between pipeline stages, each message carrying its own shape.

A message is a fixed-size int64 header [ndim, size_0, ..., size_7] followed by the tensor. The
receiver allocates from the header, so a prefill of any length and the one-token decode steps after it
travel through the same code; nothing is cached from the first call (unlike
torch.distributed.pipelining's stages, which keep the first call's shapes). Both sides know the dtype
(the model's). Messages between one pair of ranks are matched in order, so no tags are needed.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from topoplan.runner.dist import CommTimer, Dist

MAX_DIMS = 8


def send_tensor(tensor: torch.Tensor, dst: int, timer: CommTimer) -> None:
    """Send `tensor` (any shape up to 8 dimensions) to global rank `dst`."""
    if tensor.dim() > MAX_DIMS:
        raise ValueError(f"cannot send a {tensor.dim()}-dimensional tensor (at most {MAX_DIMS})")
    header = torch.zeros(MAX_DIMS + 1, dtype=torch.int64, device=tensor.device)
    header[0] = tensor.dim()
    header[1:1 + tensor.dim()] = torch.tensor(tensor.shape, dtype=torch.int64)
    with timer.timed():
        dist.send(header, dst)
        dist.send(tensor.contiguous(), dst)


def recv_tensor(src: int, dtype: torch.dtype, device: torch.device, timer: CommTimer) -> torch.Tensor:
    """Receive the next tensor global rank `src` sends, whatever its shape."""
    header = torch.empty(MAX_DIMS + 1, dtype=torch.int64, device=device)
    with timer.timed():
        dist.recv(header, src)
        ndim = int(header[0])
        tensor = torch.empty(header[1:1 + ndim].tolist(), dtype=dtype, device=device)
        dist.recv(tensor, src)
    return tensor


class Pipeline:
    """One forward step through this rank's stage: receive from the previous stage, run, send onwards."""

    def __init__(self, d: Dist):
        self.dist = d
        stage = d.coords.pp_rank
        self.prev = d.pp_ranks[stage - 1] if stage > 0 else None
        self.next = d.pp_ranks[stage + 1] if stage + 1 < len(d.pp_ranks) else None

    @property
    def is_last(self) -> bool:
        return self.next is None

    def step(self, model: torch.nn.Module, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
             slot: int, dtype: torch.dtype) -> torch.Tensor | None:
        """The last stage returns logits [B, V]; the others return None after sending their output on."""
        x = tokens if self.prev is None else recv_tensor(self.prev, dtype, self.dist.device, self.dist.timer)
        y = model(x, positions, mask, slot)
        if self.next is None:
            return y
        send_tensor(y, self.next, self.dist.timer)
        return None

    def share_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """Every stage learns the tokens the last stage picked (stage 0 embeds them next step)."""
        return self.dist.broadcast_from_last_stage(tokens)


class SingleStage:
    """The whole model in this process: no communication (the unsharded reference)."""

    is_last = True

    def step(self, model: torch.nn.Module, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
             slot: int, dtype: torch.dtype) -> torch.Tensor:
        return model(tokens, positions, mask, slot)

    def share_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        return tokens
