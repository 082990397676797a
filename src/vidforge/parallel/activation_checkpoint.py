"""Activation checkpointing of whole blocks: recompute a block's activations in the backward instead of
keeping them. `selective` checkpoints an evenly spread fraction of the blocks, trading memory for time."""

from __future__ import annotations

from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

from vidforge.errors import UserInputError


def checkpointed_indices(num_blocks: int, mode: str, ratio: float) -> list[int]:
    """Which blocks recompute: all for `full`, none for `none`, round(ratio x n) spread evenly for
    `selective` (every k-th block rather than the first ones, so memory is saved all along the depth)."""
    if mode == "none" or num_blocks == 0:
        return []
    if mode == "full":
        return list(range(num_blocks))
    if mode != "selective":
        raise UserInputError(
            f"train.activation_checkpointing: expected none, full or selective, got {mode!r}"
        )
    return spread(num_blocks, round(ratio * num_blocks))


def spread(n: int, count: int) -> list[int]:
    """`count` of the positions 0..n-1, evenly spread (every k-th, starting at 0)."""
    return sorted({int(i * n / count) for i in range(count)}) if count else []


def recompute_fraction(num_blocks: int, mode: str, ratio: float) -> float:
    """The fraction of the blocks whose forward runs again in the backward (hardware FLOPs, not model's)."""
    return len(checkpointed_indices(num_blocks, mode, ratio)) / num_blocks if num_blocks else 0.0


def apply_activation_checkpointing(
    blocks: nn.ModuleDict | nn.ModuleList, mode: str, ratio: float = 0.5
) -> list[int]:
    """Wrap the chosen blocks in place (a ModuleDict keeps its keys); returns their positions."""
    keys = list(blocks.keys()) if isinstance(blocks, nn.ModuleDict) else list(range(len(blocks)))
    chosen = checkpointed_indices(len(keys), mode, ratio)
    for i in chosen:
        blocks[keys[i]] = checkpoint_wrapper(blocks[keys[i]], preserve_rng_state=False)
    return chosen
