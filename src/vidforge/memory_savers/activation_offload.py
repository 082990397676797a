"""Activation offloading (Vchitect-2.0): the tensors a block saves for its backward wait in pinned host
memory instead of on the GPU, for an evenly spread set of the blocks that do NOT recompute. Vchitect's
"combination" splits the depth into recomputed and offloaded blocks: a block that recomputes keeps only its
input, so offloading it as well would move little and cost a copy, and the two sets stay disjoint
(`offloaded_indices`, the one owner of the choice, also used by the memory model). Little a block, but
under full recompute every block's input adds up (40 x 0.31 GiB for Wan2.1-14B at 32,760 tokens in bf16):
`train.checkpoint_offload` sends those inputs to the host as well, through the same hooks and prefetch
(musubi-tuner's activation CPU offloading with gradient checkpointing).

Why not torch's `OffloadWrapper` (autograd's `save_on_cpu`): it copies on the compute stream, so the
forward waits for every device-to-host copy, and it brings each tensor back only when the backward asks for
it, so the backward waits for every host-to-device copy. Here:
- the forward's copies run on a side stream (the compute stream goes on; the allocator is told, with
  `record_stream`, that the side stream still reads the tensor), and
- when the backward reaches an offloaded block, it starts bringing back the previous offloaded block's
  tensors on the side stream (the one the backward needs next), so that copy overlaps this block's
  backward; the compute stream waits on an event only when it really needs a tensor.
Parameters are never moved (they are the model's own, or FSDP's gathered copies, which FSDP frees and
gathers again itself). On a CPU the "host copy" is a plain copy, so the CPU tests run the same path; the
GPU suite measures the overlap (bench/gpu: step time with offload against without).

Applied after checkpointing and before compile/FSDP. The wrapper is torch's `ActivationWrapper`, which
shares the checkpoint wrapper's parameter prefix, stripped from state dicts, so checkpoints stay
interchangeable between runs with and without offloading."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import ActivationWrapper

from vidforge.errors import UserInputError
from vidforge.memory_savers.activation_checkpoint import NONE, block_policies, checkpointed_indices, spread


def offloaded_indices(
    num_blocks: int, mode: str, ratio: float, offload: float, ops_ratio: float = 0.0
) -> list[int]:
    """round(offload x n) blocks, spread evenly over the blocks that do not recompute, in full or at op
    level (capped at how many there are: the profile refuses fractions that add up to more than every
    block)."""
    policies = block_policies(num_blocks, mode, ratio, ops_ratio)
    free = [i for i, p in enumerate(policies) if p == NONE]
    return [free[i] for i in spread(len(free), min(round(offload * num_blocks), len(free)))]


@dataclass(eq=False)
class _Stash:
    """What one forward call of one offloaded block saved: host copies, and the device copies the backward
    prefetched (with the event that says they have arrived)."""

    host: list[torch.Tensor] = field(default_factory=list)
    devices: list[torch.device] = field(default_factory=list)
    fetched: list[torch.Tensor | None] | None = None
    ready: torch.cuda.Event | None = None
    reached: bool = False


class HostOffloader:
    """The side stream and the forward order of the stashes still waiting for their backward, shared by
    every offloaded block of a model (the prefetch looks one offloaded block back in that order)."""

    def __init__(self) -> None:
        self._stream: torch.cuda.Stream | None = None
        self._waiting: list[weakref.ref[_Stash]] = []  # forward order; a stash dies with its autograd graph

    def stream(self) -> torch.cuda.Stream:
        if self._stream is None:
            self._stream = torch.cuda.Stream()
        return self._stream

    def pack(self, stash: _Stash, t: torch.Tensor):
        base = t._base if t._base is not None else t  # a matmul saves its weight as a transposed view
        if isinstance(base, nn.Parameter) or (base.is_leaf and base.requires_grad):
            return t
        if not stash.host:
            self._waiting.append(weakref.ref(stash))
        if t.is_cuda:
            host = torch.empty(t.size(), dtype=t.dtype, layout=t.layout, pin_memory=True)
            side = self.stream()
            side.wait_stream(torch.cuda.current_stream(t.device))  # t is written by then
            with torch.cuda.stream(side):
                host.copy_(t, non_blocking=True)
            t.record_stream(side)  # its memory is not reused before the copy has read it
        else:
            host = t.detach().clone()
        stash.host.append(host)
        stash.devices.append(t.device)
        return stash, len(stash.host) - 1

    def unpack(self, packed) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        stash, index = packed
        if not stash.reached:  # the backward has just reached this block
            stash.reached = True
            if stash.fetched is None:
                self._fetch(stash)
            self._leave_and_prefetch_previous(stash)
        if stash.ready is not None and stash.devices[index].type == "cuda":
            torch.cuda.current_stream(stash.devices[index]).wait_event(stash.ready)
        t, stash.fetched[index] = stash.fetched[index], None  # autograd holds it from here
        return t if t is not None else stash.host[index].to(stash.devices[index])  # unpacked twice

    def _leave_and_prefetch_previous(self, stash: _Stash) -> None:
        """The backward has reached `stash`: the stash saved before it is the next one it will need."""
        alive = [(ref, ref()) for ref in self._waiting]
        self._waiting = [ref for ref, s in alive if s is not None and s is not stash]
        order = [s for _, s in alive if s is not None]
        at = order.index(stash) if stash in order else 0
        if at > 0 and order[at - 1].fetched is None:
            self._fetch(order[at - 1])

    def _fetch(self, stash: _Stash) -> None:
        """Start the host-to-device copies of a stash's GPU tensors on the side stream. A tensor the block
        saved on the host is handed back as its host copy, with no copy to make and no stream to tell:
        every tensor of a CPU run, and on a GPU the CPU scalars beside the activations (SDPA's CUDA
        kernels save their dropout seed and offset on the host)."""
        if not any(d.type == "cuda" for d in stash.devices):
            stash.fetched = list(stash.host)
            return
        side, compute = self.stream(), torch.cuda.current_stream()
        with torch.cuda.stream(side):
            fetched: list[torch.Tensor | None] = []
            for host, device in zip(stash.host, stash.devices, strict=True):
                if device.type != "cuda":
                    fetched.append(host)
                    continue
                t = host.to(device, non_blocking=True)
                t.record_stream(compute)  # allocated on the side stream, read on the compute stream
                fetched.append(t)
            stash.ready = torch.cuda.Event()
            stash.ready.record(side)
        stash.fetched = fetched


class OffloadedBlock(ActivationWrapper):
    """A block whose forward saves its tensors through the shared `HostOffloader`."""

    def __init__(self, block: nn.Module, offloader: HostOffloader) -> None:
        super().__init__(block)
        self.offloader = offloader

    def forward(self, *args, **kwargs):
        stash = _Stash()
        hooks = torch.autograd.graph.saved_tensors_hooks(
            lambda t: self.offloader.pack(stash, t), self.offloader.unpack
        )
        with hooks:
            return self._checkpoint_wrapped_module(*args, **kwargs)


def apply_activation_offload(
    blocks: nn.ModuleDict | nn.ModuleList,
    offload: float,
    mode: str = "none",
    ratio: float = 0.0,
    checkpoint_offload: bool = False,
    ops_ratio: float = 0.0,
) -> list[int]:
    """Wrap the blocks `offloaded_indices` chooses (given the checkpointing `mode` and `ratio`) in place,
    and with `checkpoint_offload` every checkpointed block too (after `apply_activation_checkpointing`):
    what a checkpointed block saves from outside its checkpoint is its input, so the same hooks send that
    to the host and the same prefetch brings it back one block ahead of its recompute. Returns the
    positions of the offloaded blocks, in order."""
    if not 0 <= offload <= 1:
        raise UserInputError(f"train.activation_offload: a fraction of the blocks in [0, 1], got {offload}")
    keys = list(blocks.keys()) if isinstance(blocks, nn.ModuleDict) else list(range(len(blocks)))
    chosen = offloaded_indices(len(keys), mode, ratio, offload, ops_ratio)
    if checkpoint_offload:
        chosen = sorted({*chosen, *checkpointed_indices(len(keys), mode, ratio, ops_ratio)})
    offloader = HostOffloader()  # one for all: the prefetch follows the forward order of every stash
    for i in chosen:
        blocks[keys[i]] = OffloadedBlock(blocks[keys[i]], offloader)
    return chosen
