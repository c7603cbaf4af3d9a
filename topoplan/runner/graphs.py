"""A decode step whose every shape and address is fixed, so a GPU can record it once as a CUDA graph and replay
it each step (`topoplan run --cuda-graphs`), as vLLM and TensorRT-LLM do for decode.

The eager step attends over the cache slice it has filled (`[:slot + 1]`), a shape that grows every step, and
takes the slot as a Python int: a recorded graph would replay the first step's shapes and slot forever. Here
the step reads everything that changes from tensors it owns (`StaticDecodeStep.x`, `.slot`): the new keys and
values go in at `slot` by `index_copy_`, attention runs over the whole cache under a mask built from `slot`
and the rows' left padding (keys after `slot` hidden), and RoPE positions are `slot - pad`. Each step copies the
new token ids (or the previous stage's hidden states) and the slot into those tensors, then runs the step:
eagerly, or by replaying what `capture` recorded.

`capture` is the boundary to the GPU: it takes the step as a function of its own tensors and returns a replay
function whose result is one fixed output tensor. `cuda_graph_capture` warms the step up on a side stream
(cuBLAS and NCCL set themselves up outside capture) and records it with `torch.cuda.graph`; tests pass a
stand-in that re-runs the step on replay. A stage's collectives are inside the step: NCCL records into CUDA
graphs; gloo and the shared-memory collectives cannot, which is why the option needs CUDA. An MoE layer cannot be
recorded: it reads each expert's row count on the host to slice the rows (topoplan.runner.moe), a read a
capture forbids and a replay would freeze, so `--cuda-graphs` refuses MoE checkpoints.

The steps outlive one generation (`generate(statics=...)`): the runner's untimed warm-up records them and the
timed generation replays them, its KV cache the same buffers (Transformer.setup_cache keeps them).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from topoplan.runner.model import Transformer

Capture = Callable[[Callable[[], torch.Tensor]], Callable[[], torch.Tensor]]


def static_decode_mask(pad: torch.Tensor, slot: torch.Tensor, cache_len: int, window: int | None) -> torch.Tensor:
    """[B, 1, 1, cache_len], True where the new token (at `slot`, a [1] tensor) may attend: causal, not the row's
    left padding, inside Mistral's window; the slot itself always (generate.attention_mask's rules)."""
    keys = torch.arange(cache_len, device=pad.device)[None, :]  # [1, S]
    allowed = (keys <= slot) & (keys >= pad[:, None])  # [B, S]
    if window is not None:
        allowed &= (slot - keys) < window
    allowed |= keys == slot
    return allowed[:, None, None, :]


class StaticDecodeStep:
    """One micro-batch's decode step on one stage with fixed shapes: `x` holds its input (token ids [b, 1] on the
    first stage, hidden states [b, 1, D] on the others), `slot` the cache position it writes."""

    def __init__(self, model: Transformer, x: torch.Tensor, pad: torch.Tensor, rows: slice, cache_len: int,
                 capture: Capture | None = None):
        self.model, self.rows, self.cache_len = model, rows, cache_len
        self.x = torch.zeros_like(x)
        self.pad = torch.zeros_like(pad)  # each row's left padding
        self.slot = torch.zeros(1, dtype=torch.long, device=x.device)
        self._capture, self._replay = capture, None

    def _step(self) -> torch.Tensor:
        positions = (self.slot - self.pad)[:, None].clamp(min=0)  # [b, 1]
        mask = static_decode_mask(self.pad, self.slot, self.cache_len, self.model.config.sliding_window)
        return self.model(self.x, positions, mask, self.slot, self.rows)

    def __call__(self, x: torch.Tensor, slot: int, pad: torch.Tensor) -> torch.Tensor:
        """The step's output for input `x` writing cache position `slot` of rows left-padded by `pad`; the first
        call records the step when a capture was given (a generation reusing the step, with the same KV cache
        buffers, replays that recording). With a capture, the result is the same tensor every call: use it
        before the next."""
        self.x.copy_(x)
        self.pad.copy_(pad)
        self.slot.fill_(slot)
        if self._capture is None:
            return self._step()
        if self._replay is None:
            self._replay = self._capture(self._step)
        return self._replay()


def cuda_graph_capture(step: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    """Record `step` as a CUDA graph (after two warm-up runs on a side stream) and return its replay, whose
    result is the output tensor the recording wrote."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()

    def replay() -> torch.Tensor:
        graph.replay()
        return out

    return replay
