"""Block swap (`train.lora.blocks_to_swap`): the frozen weights of the last N transformer blocks wait in
pinned host memory, and each comes to the device one block ahead of its use, copied on a side stream
while the block before it computes (musubi-tuner's `blocks_to_swap`). The forward brings swapped blocks
in forward order and sends each back when it is done; the backward brings them in reverse order, the
block whose backward runs next prefetched while the current one computes. At most two swapped blocks'
weights are on the device at once.

Only frozen weights swap (LoRA's base): they never change, so "sending back" is pointing the parameter at
its host copy again and dropping the device copy, no copy back. The trained adapters stay on the device.
Autograd keeps a leaf's saved weight as the parameter itself, so the backward reads whatever the
parameter points at when it runs: the block's weights are on the device again by then (the backward
entry below), and no device copy lives between the forward and the backward.

The wrapper goes around whatever else wraps the block (activation checkpointing, offload, compile), so
a checkpointed block's recompute finds its weights on the device. It is torch's `ActivationWrapper`, whose
parameter prefix state dicts strip, so checkpoints do not change with it. On a CPU the host copy and the
device copy are the same memory: the CPU tests run the whole schedule, with copies that change nothing.

This is the one-process swap. Under FSDP2 a rank holds only its shards of a block, and FSDP2 owns where
they live: the swapped blocks get its CPU offload (`vidforge.parallel.fsdp.apply_fsdp`'s host_blocks), the
same schedule (each block all-gathered one ahead, in reverse order in the backward).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import ActivationWrapper


def swapped_indices(num_blocks: int, count: int) -> list[int]:
    """The last `count` blocks (capped at every block)."""
    return list(range(max(num_blocks - count, 0), num_blocks))


@dataclass(eq=False)
class _Weights:
    """One swapped block's frozen parameters: their host copies, and the device copies while fetched."""

    params: list[nn.Parameter]
    host: list[torch.Tensor]
    device: torch.device
    fetched: list[torch.Tensor] | None = None
    ready: torch.cuda.Event | None = None


@dataclass(eq=False)
class BlockSwapper:
    """The swapped blocks in forward order, the side stream, and the log of what it did (the schedule the
    tests check): ("fetch", i) a copy to the device started, ("in", i) block i computes from device
    weights, ("out", i) its device copy dropped."""

    order: list[int] = field(default_factory=list)
    weights: dict[int, _Weights] = field(default_factory=dict)
    log: list[tuple[str, int]] = field(default_factory=list)
    _stream: torch.cuda.Stream | None = None

    def add(self, index: int, block: nn.Module, device: torch.device) -> None:
        params = [p for p in block.parameters() if not p.requires_grad]
        host = []
        for p in params:
            h = p.data if p.device.type == "meta" else p.data.to("cpu")  # meta: `train --dry-run`
            if device.type == "cuda":
                h = h.pin_memory()
            p.data = h
            host.append(h)
        self.order.append(index)
        self.weights[index] = _Weights(params, host, device)

    def _neighbour(self, index: int, step: int) -> int | None:
        at = self.order.index(index) + step
        return self.order[at] if 0 <= at < len(self.order) else None

    def fetch(self, index: int) -> None:
        """Start copying block `index`'s weights to the device (a no-op when they are there or coming)."""
        w = self.weights[index]
        if w.fetched is not None:
            return
        self.log.append(("fetch", index))
        if w.device.type != "cuda":
            w.fetched = list(w.host)
            return
        if self._stream is None:
            self._stream = torch.cuda.Stream(w.device)
        compute = torch.cuda.current_stream(w.device)
        with torch.cuda.stream(self._stream):
            w.fetched = []
            for h in w.host:
                t = h.to(w.device, non_blocking=True)
                t.record_stream(compute)  # allocated on the side stream, read on the compute stream
                w.fetched.append(t)
            w.ready = torch.cuda.Event()
            w.ready.record(self._stream)

    def arrive(self, index: int, step: int) -> None:
        """Block `index` is about to compute (forward: step 1; backward: step -1): its weights on the
        device, the next block's in that direction on their way, every other swapped block's sent back."""
        self.fetch(index)
        w = self.weights[index]
        if w.ready is not None:
            torch.cuda.current_stream(w.device).wait_event(w.ready)
            w.ready = None
        for p, t in zip(w.params, w.fetched or [], strict=True):
            p.data = t
        self.log.append(("in", index))
        nxt = self._neighbour(index, step)
        for other in self.order:
            if other not in (index, nxt) and self.weights[other].fetched is not None:
                self.leave(other)
        if nxt is not None:
            self.fetch(nxt)

    def leave(self, index: int) -> None:
        """Point block `index`'s parameters at their host copies again; the device copies are freed."""
        w = self.weights[index]
        for p, h in zip(w.params, w.host, strict=True):
            p.data = h
        w.fetched, w.ready = None, None
        self.log.append(("out", index))


class _BackwardArrive(torch.autograd.Function):
    """Identity on the block's output; its backward runs just before the block's own: bring the block in."""

    @staticmethod
    def forward(ctx, swapper: BlockSwapper, index: int, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.swapper, ctx.index = swapper, index
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        ctx.swapper.arrive(ctx.index, -1)
        return None, None, grad


class SwappedBlock(ActivationWrapper):
    """A block whose frozen weights live on the host between its uses (`BlockSwapper`)."""

    def __init__(self, block: nn.Module, swapper: BlockSwapper, index: int) -> None:
        super().__init__(block)
        self.swapper, self.index = swapper, index

    def forward(self, *args, **kwargs):
        self.swapper.arrive(self.index, 1)
        out = self._checkpoint_wrapped_module(*args, **kwargs)
        if torch.is_grad_enabled() and out.requires_grad:
            out = _BackwardArrive.apply(self.swapper, self.index, out)
        if self.swapper._neighbour(self.index, 1) is None and not (
            torch.is_grad_enabled() and out.requires_grad
        ):
            self.swapper.leave(self.index)  # no backward will come for it
        return out


def apply_block_swap(blocks: nn.ModuleDict, count: int, device: torch.device) -> BlockSwapper | None:
    """Wrap the last `count` blocks in place (after checkpointing, offload and compile wrapped them);
    their frozen weights move to (pinned) host memory. None when count is 0."""
    if count <= 0:
        return None
    keys = list(blocks.keys())
    swapper = BlockSwapper()
    for i in swapped_indices(len(keys), count):
        swapper.add(i, blocks[keys[i]], device)
        blocks[keys[i]] = SwappedBlock(blocks[keys[i]], swapper, i)
    return swapper
