"""ST-DiT sequence parallel sliced by space (parallel.cp_impl=st-spatial, after Vchitect-2.0): every
context-parallel rank holds the same (h, w) positions of every frame of every sample (`TokenShard` with
`slicing="positions"`), instead of whole frames as `st-hybrid` (`stdit_parallel.py`) does.

Why: a clip's spatial sequence (H x W) is longer than its temporal one and never 1, while T is 1 for an
image and odd for 17 or 33 video frames (latent T = 5, 9), which st-hybrid cannot split over two ranks; so
joint image-video training needs the split by positions. When H x W does not divide by cp the last
columns of some ranks are pads (`TokenShard`), which cost memory and all-to-all bytes but no correctness.

Per self-attention scope (`STSpatialAttend`, installed by `apply_st_spatial`):

- temporal: local. A rank's tokens of a sample are a (T, 1, q) grid of whole position columns, so the
  ordinary temporal scope of that grid is the sample's temporal attention (pad columns attend among
  themselves; no real query sees a pad).
- spatial, and the parallel block's full attention: head-parallel (DeepSpeed-Ulysses over heads). One
  all-to-all turns (my positions, all heads) into (every position, my H/cp heads), the tokens are put in
  row order (pads dropped) and attended with the whole row's own spatial or full scope, and one
  all-to-all turns the output back. Chosen over an all-gather of K/V because it moves 4 (cp-1)/cp of the
  local q/k/v/out a pass instead of 2 (cp-1) for K/V (less from cp = 3 on, equal at 2), keeps no
  gathered K/V for the backward, and balances the attention work exactly; it needs heads / tp divisible
  by cp, which the layout rulebook checks.
- cross-attention (text) is untouched: each rank's queries attend to their sample's whole caption,
  whose projection every rank computes. Vchitect shards the text because its text is in the joint
  attention (the multimodal block, which has no context-parallel plan here); for a cross-attention
  caption of L tokens the replicated key/value projection costs about L / S of a block's
  linear FLOPs (S the clip's tokens; under 2% at L = 512, S = 32k), less than an all-gather would.

RoPE, the absolute position embedding and the per-token conditioning read the shard's positions, which
are each token's true (t, h, w). Autograd runs through the all-to-alls (their backward is the reverse
all-to-all); the parameter gradients are partial sums per rank, as under every context parallel.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from vidforge.attention.dispatch import Attend, AttentionMask
from vidforge.errors import UserInputError
from vidforge.models.scopes import Scope, batch_scopes, packed_scopes
from vidforge.parallel.context_parallel import ContextParallelAttend, CpGroup, cp_process_group
from vidforge.parallel.stdit_parallel import _a2a, attend_in, install_st_attend
from vidforge.tokens import ContextShard, Grid, SequenceLayout, TokenShard


@dataclass(frozen=True, eq=False)
class _SpatialPlan:
    """Host-built once per (row shape, cp degree): the local temporal scope, the whole row's spatial and
    full scopes, and `rows`: for every real token in row order, its place in the gathered order."""

    temporal: Scope
    row_scopes: dict[str, Scope]
    rows: torch.Tensor


@functools.lru_cache(maxsize=64)
def _spatial_plan(grids: tuple[Grid, ...], packed: bool, size: int, batch: int, device: str) -> _SpatialPlan:
    layout = SequenceLayout(grids)
    shard = TokenShard(layout, 0, size, packed, slicing="positions")  # the maps are the same on every rank
    if packed:
        temporal = packed_scopes(SequenceLayout(shard.local_grids), device)["temporal"]
        row_scopes = packed_scopes(layout, device)
    else:
        temporal = batch_scopes(batch, shard.local_grids[0])["temporal"]
        row_scopes = batch_scopes(batch, grids[0])
    return _SpatialPlan(temporal, row_scopes, shard.gathered_row_index(device))


def _heads_to_positions(x: torch.Tensor, group: dist.ProcessGroup, size: int) -> torch.Tensor:
    """(B, local, H, D) my tokens with every head -> (B, size * local, H / size, D): every rank's tokens
    (gathered order) with my group of heads."""
    send = x.unflatten(2, (size, -1)).movedim(2, 0)  # to rank j: my tokens, head group j
    return _a2a(send, group).movedim(0, 1).flatten(1, 2)


def _positions_to_heads(x: torch.Tensor, group: dist.ProcessGroup, size: int) -> torch.Tensor:
    """The inverse of `_heads_to_positions`."""
    send = x.unflatten(1, (size, -1)).movedim(1, 0)  # to rank j: its tokens, my head group
    return _a2a(send, group).permute(1, 2, 0, 3, 4).flatten(2, 3)


class STSpatialAttend(ContextParallelAttend):
    """A self-attention's `Attend` under parallel.cp_impl=st-spatial (see the module docstring). Without a
    `ContextShard` mask it runs the wrapped `Attend` unchanged."""

    IMPL = "st-spatial"

    def __init__(self, inner: Attend, group: dist.ProcessGroup) -> None:
        super().__init__(inner, group, "ulysses")  # head-parallel: the base's impl is never called

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask = None):
        if not isinstance(mask, ContextShard):
            return self.inner(q, k, v, mask)
        shard: TokenShard = mask.shard
        size = dist.get_world_size(self.group)
        if shard.slicing != "positions" or shard.size != size or shard.rank != dist.get_rank(self.group):
            raise UserInputError(
                f"parallel.cp_impl=st-spatial needs this rank's TokenShard by positions (rank "
                f"{dist.get_rank(self.group)} of {size}), got rank {shard.rank} of {shard.size} by "
                f"{shard.slicing}: make it with shard_of(row, cp_mesh, slicing='positions')"
            )
        plan = _spatial_plan(shard.layout.grids, shard.packed, size, q.shape[0], str(q.device))
        if mask.scope == "temporal":
            return attend_in(plan.temporal, self.inner, q, k, v)
        batch, local, heads = q.shape[:3]
        if heads % size:
            raise UserInputError(
                f"parallel.cp_impl=st-spatial splits the {heads} attention heads (per tensor-parallel rank) "
                f"over cp={size} ranks; make model.heads / parallel.tp divisible by parallel.cp, or use "
                "parallel.cp_impl=st-hybrid"
            )
        dims = (q.shape[-1], k.shape[-1], v.shape[-1])
        qkv = _heads_to_positions(torch.cat([q, k, v], dim=-1), self.group, size)
        qkv = qkv.index_select(1, plan.rows)  # the whole row in row order, pads dropped
        out = attend_in(plan.row_scopes[mask.scope], self.inner, *qkv.split(dims, dim=-1))
        gathered = out.new_zeros((batch, size * local, heads // size, dims[2]))
        return _positions_to_heads(gathered.index_copy(1, plan.rows, out), self.group, size)

    def extra_repr(self) -> str:
        return f"st-spatial, cp={dist.get_world_size(self.group)}"

    def __deepcopy__(self, memo: dict) -> STSpatialAttend:
        # A process group cannot be copied: copies of the model share it.
        clone = STSpatialAttend(copy.deepcopy(self.inner, memo), self.group)
        clone.train(self.training)
        return clone


def apply_st_spatial(model: nn.Module, cp_mesh: CpGroup) -> nn.Module:
    """parallel.cp_impl=st-spatial: install `STSpatialAttend` in every self-attention layer of an ST-DiT
    (in place; returns the model). Then run the model on its positions `TokenShard` as under `apply_cp`
    (`shard_of(row, cp_mesh, slicing="positions")`, `shard.split`, `model(..., shard=shard)`,
    `shard_loss`, `gather_row`). Only swaps parameter-free modules, so it composes with tensor parallel,
    checkpointing and FSDP in any order. Idempotent."""
    group = cp_process_group(cp_mesh)
    return install_st_attend(model, STSpatialAttend, lambda inner: STSpatialAttend(inner, group))
