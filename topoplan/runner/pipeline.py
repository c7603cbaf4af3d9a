"""Point-to-point messages between pipeline stages: activations down the pipeline, tokens back to stage 0.

An activation message is a fixed-size int64 header [ndim, size_0, ..., size_7] followed by the tensor, so
a prefill of any length and the one-token decode steps after it travel through the same code; a header
whose ndim is SKIP or STOP carries no tensor (stage 0 telling the stages after it that a micro-batch has
finished, or that everything has). The last stage sends each micro-batch's new tokens straight back to
stage 0, which needs them for its next step: with several micro-batches in flight the stages never wait
for each other at a step boundary (topoplan.runner.generate's schedule).

Sends are asynchronous (isend), so a stage that has sent onwards can receive tokens coming back while its
message is still in flight (a blocking send on both sides of a two-stage ring could wait forever); a sent
tensor is kept until its send completes. Both sides know the dtype (the model's). Messages between one pair
of ranks are matched in order; tokens travel with their own tag.

When the stages are CPU ranks of one host the messages go through shared-memory channels instead
(topoplan.runner.shm.ShmChannels: a gloo message costs ~1 ms of loopback TCP and helper threads, a channel a
copy): the header words and the tensor in one slot, a tensor above the slot's size by gloo after its header.
A sender waits only when all of a channel's slots are unread, which cannot deadlock the ring while the
micro-batches in flight are no more than the slots (a stage then never has more messages outstanding to one
peer); with more, the pipeline stays on gloo.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from topoplan.runner.dist import CommTimer, Dist

MAX_DIMS = 8
SKIP, STOP = -1, -2  # header[0] values that carry no tensor
ACTIVATIONS, TOKENS = 0, 1  # message tags


class Outbox:
    """Asynchronous sends whose tensors must stay alive until they complete."""

    def __init__(self, timer: CommTimer):
        self.timer, self.pending = timer, []

    def send(self, tensor: torch.Tensor, dst: int, tag: int) -> None:
        with self.timer.timed():
            self.pending.append((dist.isend(tensor, dst, tag=tag), tensor))
        self.pending = [(work, t) for work, t in self.pending if not work.is_completed()]

    def flush(self) -> None:
        if not self.pending:
            return
        with self.timer.timed():
            for work, _ in self.pending:
                work.wait()
        self.pending = []


def header_of(tensor: torch.Tensor | None, code: int = 0) -> list[int]:
    """The header announcing `tensor`'s shape [ndim, size_0, ..., 0 ...], or a control code (SKIP, STOP) with
    no tensor."""
    if tensor is None:
        return [code] + [0] * MAX_DIMS
    if tensor.dim() > MAX_DIMS:
        raise ValueError(f"cannot send a {tensor.dim()}-dimensional tensor (at most {MAX_DIMS})")
    return [tensor.dim(), *tensor.shape] + [0] * (MAX_DIMS - tensor.dim())


class Pipeline:
    """This rank's place in its pipeline: where activations come from and go, and where tokens go back.
    `in_flight`: the micro-batches generate keeps in flight (whether the shared-memory channels may carry them)."""

    def __init__(self, d: Dist, in_flight: int = 1):
        self.dist = d
        self.stage = stage = d.coords.pp_rank
        self.stages = len(d.pp_ranks)
        self.prev = d.pp_ranks[stage - 1] if stage > 0 else None
        self.next = d.pp_ranks[stage + 1] if stage + 1 < len(d.pp_ranks) else None
        self.first_rank, self.last_rank = d.pp_ranks[0], d.pp_ranks[-1]
        self.outbox = Outbox(d.timer)
        self.shm = d.pp_shm if d.pp_shm is not None and in_flight <= d.pp_shm.slots else None
        # channel s carries stage s's activations to stage s + 1; the last channel the tokens back to stage 0

    @property
    def is_first(self) -> bool:
        return self.prev is None

    @property
    def is_last(self) -> bool:
        return self.next is None

    def send_on(self, tensor: torch.Tensor | None, code: int = 0) -> None:
        """Activations (or a control code) to the next stage."""
        assert self.next is not None
        header = header_of(tensor, code)
        if self.shm is not None:
            with self.dist.timer.timed():
                travelled = self.shm.send(self.stage, header, tensor)
            if travelled:
                return
        else:
            self.outbox.send(torch.tensor(header, dtype=torch.int64, device=self.dist.device), self.next, ACTIVATIONS)
        if tensor is not None:
            self.outbox.send(tensor.contiguous(), self.next, ACTIVATIONS)

    def receive(self, dtype: torch.dtype) -> torch.Tensor | int:
        """The previous stage's next message: activations, or a control code."""
        assert self.prev is not None
        device, timer = self.dist.device, self.dist.timer
        with timer.timed():
            payload = None
            if self.shm is not None:
                header, payload = self.shm.receive(self.stage - 1)
            else:
                received = torch.empty(MAX_DIMS + 1, dtype=torch.int64, device=device)
                dist.recv(received, self.prev, tag=ACTIVATIONS)
                header = received.tolist()
            ndim = header[0]
            if ndim < 0:
                return ndim
            shape = header[1:1 + ndim]
            if payload is not None:
                return payload.view(dtype).view(shape)
            tensor = torch.empty(shape, dtype=dtype, device=device)
            dist.recv(tensor, self.prev, tag=ACTIVATIONS)
        return tensor

    def send_tokens(self, tokens: torch.Tensor) -> None:
        """A micro-batch's new tokens, from the last stage back to stage 0."""
        if self.shm is not None:
            with self.dist.timer.timed():
                if self.shm.send(self.stages - 1, [len(tokens)], tokens):
                    return
        self.outbox.send(tokens.contiguous(), self.first_rank, TOKENS)

    def receive_tokens(self, rows: int) -> torch.Tensor:
        with self.dist.timer.timed():
            if self.shm is not None:
                _, payload = self.shm.receive(self.stages - 1)
                if payload is not None:
                    return payload.view(torch.long)
            tokens = torch.empty(rows, dtype=torch.long, device=self.dist.device)
            dist.recv(tokens, self.last_rank, tag=TOKENS)
        return tokens

    def close(self) -> None:
        self.outbox.flush()


class SingleStage:
    """The whole model in this process: no communication (the unsharded reference)."""

    stages = 1
    is_first = is_last = True

    def close(self) -> None:
        pass
