"""Activation offloading (Vchitect-2.0): the tensors a block saves for its backward are copied to pinned
CPU memory in the forward and back to the GPU when the backward needs them, for an evenly spread fraction
of the blocks. Combined with activation checkpointing, a checkpointed block saves only its input, and
that input is what goes to the CPU: the two multiply their savings.

Applied after checkpointing (the offload wrapper sits outside the checkpoint wrapper, so it sees what the
checkpoint keeps) and before compile/FSDP. torch's `OffloadWrapper` (autograd's `save_on_cpu`) does the
copying; it shares the checkpoint wrapper's parameter prefix, which `torch.distributed.checkpoint` strips,
so checkpoints stay interchangeable between runs with and without offloading."""

from __future__ import annotations

from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import offload_wrapper

from vidforge.parallel.activation_checkpoint import checkpointed_indices


def apply_activation_offload(blocks: nn.ModuleDict | nn.ModuleList, ratio: float) -> list[int]:
    """Wrap round(ratio x n) evenly spread blocks in place; returns their positions."""
    if not 0 <= ratio <= 1:
        raise ValueError(f"train.activation_offload: a fraction of the blocks in [0, 1], got {ratio}")
    keys = list(blocks.keys()) if isinstance(blocks, nn.ModuleDict) else list(range(len(blocks)))
    chosen = checkpointed_indices(len(keys), "selective", ratio)
    for i in chosen:
        blocks[keys[i]] = offload_wrapper(blocks[keys[i]])
    return chosen
