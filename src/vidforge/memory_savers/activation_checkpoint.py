"""Activation checkpointing, per block: a block recomputes in the backward everything it ran (`full`: it
keeps only its input), only its cheap ops (`ops`: torch's selective activation checkpointing with a
policy that keeps the outputs of its matmuls and attention kernels and recomputes the norms, modulation,
activations and other elementwise work from them), or nothing (`none`: autograd keeps what it saves).

The profile's `train.activation_checkpointing` says which block does what: `none` and `full` every block
alike, `selective` a `checkpoint_ratio` of the blocks in full and a `checkpoint_ops_ratio` of them at op
level (each set spread evenly along the depth), and `auto` the same mix chosen by the memory model
(`vidforge.estimate.recompute`, which writes the two ratios and leaves the mode `selective`)."""

from __future__ import annotations

import functools
import inspect

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from vidforge.errors import UserInputError

FULL, OPS, NONE = "full", "ops", "none"
POLICIES = (FULL, OPS, NONE)
"""A block's recompute, most first."""


def block_policies(num_blocks: int, mode: str, ratio: float, ops_ratio: float = 0.0) -> list[str]:
    """Each block's recompute (`POLICIES`): every block `full` or `none` alike; under `selective`
    round(ratio x n) blocks in full spread evenly (every k-th block rather than the first ones, so memory
    is saved all along the depth), then round(ops_ratio x n) of the rest at op level, spread the same way."""
    if mode in (NONE, FULL):
        return [mode] * num_blocks
    if mode == "auto":
        raise UserInputError(
            "train.activation_checkpointing=auto: resolve it with the memory model first "
            "(vidforge.estimate.recompute.resolve_auto); set none, full or selective to pick by hand"
        )
    if mode != "selective":
        raise UserInputError(
            f"train.activation_checkpointing: expected none, full, selective or auto, got {mode!r}"
        )
    out = [NONE] * num_blocks
    for i in spread(num_blocks, round(ratio * num_blocks)):
        out[i] = FULL
    rest = [i for i, p in enumerate(out) if p == NONE]
    for j in spread(len(rest), min(round(ops_ratio * num_blocks), len(rest))):
        out[rest[j]] = OPS
    return out


def checkpointed_indices(num_blocks: int, mode: str, ratio: float, ops_ratio: float = 0.0) -> list[int]:
    """The blocks that recompute in full (keep only their input)."""
    return [i for i, p in enumerate(block_policies(num_blocks, mode, ratio, ops_ratio)) if p == FULL]


def op_checkpointed_indices(num_blocks: int, mode: str, ratio: float, ops_ratio: float = 0.0) -> list[int]:
    """The blocks that recompute at op level (keep their input and their matmul and attention outputs)."""
    return [i for i, p in enumerate(block_policies(num_blocks, mode, ratio, ops_ratio)) if p == OPS]


def spread(n: int, count: int) -> list[int]:
    """`count` of the positions 0..n-1, evenly spread (every k-th, starting at 0)."""
    return sorted({int(i * n / count) for i in range(count)}) if count else []


OPS_RECOMPUTE_COST = 0.1
"""The time an op-level block's recompute takes, as a share of a full block's forward: the norms,
modulation, RoPE, activation and residual work between the saved matmuls and attention kernels. These
move memory and do few FLOPs (a Wan block at 32K tokens: well under 1% of its FLOPs, some 10% of its
forward time on an H200's kernels); the planner weighs it against a full recompute's 1, and the GPU
suite's recompute rows measure it."""


def recompute_fraction(num_blocks: int, mode: str, ratio: float, ops_ratio: float = 0.0) -> float:
    """The fraction of the blocks' forward FLOPs that runs again in the backward (hardware FLOPs, not the
    model's): each fully recomputed block's forward; an op-level block's matmuls and attention do not run
    again, and their few FLOPs are left out."""
    if not num_blocks:
        return 0.0
    return len(checkpointed_indices(num_blocks, mode, ratio, ops_ratio)) / num_blocks


def saves_output(op: object) -> bool:
    """Whether an op-level checkpointed block keeps this op's output: matmuls (plain, batched of a
    projection, float8) and the attention kernels (SDPA's fused ones, flex, flash-attn). SDPA's math
    fallback is not one op (it decomposes into its score matmuls, which would keep tokens^2 scores), so
    batched matmuls are kept only under no attention kernel that computes scores: `bmm` is left out."""
    name = str(op)
    if name.startswith(("aten.mm.", "aten.addmm.", "aten._scaled_mm.")):
        return True
    if "scaled_dot_product" in name:
        return "math" not in name
    return "flex_attention" in name or "flash_attn" in name


def _policy(ctx: object, op: object, *args: object, **kwargs: object) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if saves_output(op) else CheckpointPolicy.PREFER_RECOMPUTE


def op_level_contexts() -> tuple[object, object]:
    """torch's selective checkpoint contexts with `saves_output`'s policy (a fresh cache a call)."""
    return create_selective_checkpoint_contexts(_policy)


@functools.cache
def _respects_hooks_kwarg() -> dict[str, bool]:
    """Newer torch (2.14) can route what selective checkpointing caches through the saved-tensor hooks
    around it (activation offload, `vidforge.bench.measure`): asked for where it exists."""
    params = inspect.signature(torch.utils.checkpoint.checkpoint).parameters
    return {"respect_saved_tensors_hooks": True} if "respect_saved_tensors_hooks" in params else {}


def apply_activation_checkpointing(
    blocks: nn.ModuleDict | nn.ModuleList, mode: str, ratio: float = 0.5, ops_ratio: float = 0.0
) -> list[str]:
    """Wrap the blocks in place (a ModuleDict keeps its keys) by their `block_policies`; returns them."""
    keys = list(blocks.keys()) if isinstance(blocks, nn.ModuleDict) else list(range(len(blocks)))
    policies = block_policies(len(keys), mode, ratio, ops_ratio)
    for key, policy in zip(keys, policies, strict=True):
        if policy == FULL:
            blocks[key] = checkpoint_wrapper(blocks[key], preserve_rng_state=False)
        elif policy == OPS:
            blocks[key] = checkpoint_wrapper(
                blocks[key],
                preserve_rng_state=False,
                context_fn=op_level_contexts,
                **_respects_hooks_kwarg(),
            )
    return policies
