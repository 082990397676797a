"""Context parallel for full attention (DiT): the token sequence split over the cp ranks.

How a model runs under context parallel:

1. `apply_cp(model, cp_mesh, impl)` replaces the `Attend` of every self-attention layer with a
   `ContextParallelAttend` holding the cp process group (cross-attention is untouched: text is short,
   each rank's queries attend to their samples' whole captions locally).
2. Every rank makes the same `TokenShard` of its row (`shard_of(layout_or_grid, cp_mesh)`), takes its
   tokens with `shard.split(tokens)` and calls `model(local_tokens, ..., shard=shard)`; the model slices
   positions, RoPE and per-token conditioning to the rank's tokens and hands full attention a
   `ContextShard` mask, which the installed attention evaluates with `parallel.cp_impl`
   (`vidforge.parallel.cp_attention`: all-gather, ring or ulysses; `vidforge.parallel.usp_attention`:
   usp, Ulysses inside the cp group's sub-groups and the ring across them). A joint attention over
   [video, caption] (MM-DiT) hands a `JointShard` instead: only its video tokens are split
   (`vidforge.parallel.joint_attention`).
3. The output is the rank's tokens; `gather_row(out, shard, group)` assembles the full row where it is
   needed (sampling), while training keeps it local. A training step draws sigma, caption dropout and
   noise identically on every cp rank of a data-parallel group, splits clean latents and noise with
   `shard.split`, broadcasts sigma with `per_token(sigma, shard)`, and takes `shard_loss`: this rank's
   share of the micro-batch mean, the shares summing over cp to the single-process loss.

Gradients of the (replicated) parameters are partial sums per cp rank: FSDP over `dp_shard_cp`
reduces them (it averages, so backpropagate cp x the share; see `shard_loss`). Copies of a model with
cp attention installed share its process group; parameter names and state dicts are unchanged.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from vidforge.attention.dispatch import Attend, AttentionMask
from vidforge.attention.sliding_tile import TiledShard
from vidforge.errors import UserInputError
from vidforge.parallel.cp_attention import CP_ATTENTION, gather_tokens
from vidforge.parallel.joint_attention import JointShard, joint_attention
from vidforge.parallel.usp_attention import UspGroups, usp_attention
from vidforge.profile.parallel import SLIDING_TILE_CP_IMPLS
from vidforge.tokens import ContextShard, Grid, SequenceLayout, TokenShard

CpGroup = DeviceMesh | dist.ProcessGroup

FULL_ATTENTION = {**CP_ATTENTION, "usp": usp_attention}
"""Every full-attention context-parallel implementation, by parallel.cp_impl."""


def cp_process_group(cp_mesh: CpGroup) -> dist.ProcessGroup:
    """The process group of a 1-D cp mesh (e.g. `ParallelDims.mesh["cp"]`), or the group itself."""
    if isinstance(cp_mesh, DeviceMesh):
        if cp_mesh.ndim != 1:
            raise ValueError(f"context parallel needs the 1-D cp mesh (mesh['cp']), got {cp_mesh.ndim} dims")
        return cp_mesh.get_group()
    return cp_mesh


class ContextParallelAttend(nn.Module):
    """Replaces a self-attention layer's `Attend`: full attention over a `ContextShard` runs the cp
    implementation over the group; any other mask (a model called without a shard) runs the wrapped
    `Attend` unchanged, so the same model serves single-rank evaluation."""

    def __init__(
        self,
        inner: Attend,
        group: dist.ProcessGroup,
        impl: str,
        regather: bool = False,
        usp_groups: UspGroups | None = None,
    ) -> None:
        super().__init__()
        _check_impl(impl)
        _check_usp_groups(impl, usp_groups)
        self.inner = inner
        self.group = group
        self.impl = impl
        self.regather = regather and impl == "all-gather"  # parallel.cp_regather: the others gather nothing
        self.usp_groups = usp_groups if impl == "usp" else None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask = None):
        if not isinstance(mask, ContextShard):
            return self.inner(q, k, v, mask)
        if mask.scope != "full":
            raise UserInputError(
                f"parallel.cp_impl={self.impl} splits full attention only; ST-DiT's {mask.scope} attention "
                "under context parallel needs parallel.cp_impl=st-hybrid or st-spatial"
            )
        shard = mask.shard
        if shard.size != dist.get_world_size(self.group) or shard.rank != dist.get_rank(self.group):
            raise ValueError(
                f"the TokenShard is rank {shard.rank} of {shard.size}, but this process is rank "
                f"{dist.get_rank(self.group)} of a cp group of {dist.get_world_size(self.group)}: "
                "make the shard with shard_of(..., cp_mesh)"
            )
        if isinstance(mask, JointShard):  # video tokens split, the caption's replicated (MM-DiT)
            return joint_attention(
                q,
                k,
                v,
                mask,
                self.group,
                self.impl,
                self.inner.backend,
                self.inner.sdpa_backend,
                self.regather,
                self.usp_groups,
            )
        extra = {"regather": True} if self.regather else {}
        if self.usp_groups is not None:
            extra = {"groups": self.usp_groups}
        if isinstance(mask, TiledShard):
            if self.impl not in SLIDING_TILE_CP_IMPLS:
                raise UserInputError(
                    f"model.attention_window: sliding-tile attention runs under parallel.cp_impl "
                    f"{', '.join(SLIDING_TILE_CP_IMPLS)}, not {self.impl}"
                )
            extra["tiles"] = mask
        return FULL_ATTENTION[self.impl](
            q, k, v, shard, self.group, self.inner.backend, self.inner.sdpa_backend, **extra
        )

    def extra_repr(self) -> str:
        return f"impl={self.impl}, cp={dist.get_world_size(self.group)}"

    def __deepcopy__(self, memo: dict) -> ContextParallelAttend:
        # A process group cannot be copied: copies of the model (EMA, evaluation) share it.
        clone = ContextParallelAttend(
            copy.deepcopy(self.inner, memo), self.group, self.impl, self.regather, self.usp_groups
        )
        clone.train(self.training)
        return clone


def apply_cp(
    model: nn.Module,
    cp_mesh: CpGroup,
    impl: str = "all-gather",
    regather: bool = False,
    usp_groups: UspGroups | None = None,
) -> nn.Module:
    """Install context-parallel attention in every attention layer of `model` (in place; returns
        it). Apply after pipeline splitting and tensor parallel (it only swaps parameter-free modules, so
        the order with TP, checkpointing and FSDP does not matter otherwise). A second call changes nothing
    (it keeps the first call's group and impl). `regather` (all-gather only): keep the local K/V shard
    for the backward and gather again there. `usp_groups` (usp only): the cp group's Ulysses and ring
    sub-groups, `ParallelDims.cp_2d_groups`."""
    group = cp_process_group(cp_mesh)
    _check_impl(impl)
    replaced = 0
    for module in model.modules():
        # Every attention layer's `Attend` (the DiT's SelfAttention, Wan's attention modules): only a
        # ContextShard mask (full self-attention over a split row) takes the cp path, so wrapping a
        # cross-attention's Attend too changes nothing there.
        if isinstance(getattr(module, "attend", None), Attend):
            module.attend = ContextParallelAttend(module.attend, group, impl, regather, usp_groups)
            replaced += 1
    if not replaced and not any(isinstance(m, ContextParallelAttend) for m in model.modules()):
        raise ValueError("apply_cp found no self-attention layer to make context-parallel")
    return model


def _check_impl(impl: str) -> None:
    if impl not in FULL_ATTENTION:
        raise UserInputError(
            f"parallel.cp_impl: {impl!r} is not a full-attention implementation; use one of "
            f"{', '.join(FULL_ATTENTION)} (st-hybrid is applied by vidforge.parallel.stdit_parallel)"
        )


def _check_usp_groups(impl: str, usp_groups: UspGroups | None) -> None:
    if impl == "usp" and usp_groups is None:
        raise UserInputError(
            "parallel.cp_impl=usp needs the cp group's Ulysses and ring sub-groups: pass "
            "usp_groups=UspGroups(*ParallelDims.cp_2d_groups(parallel.cp_ulysses))"
        )


def shard_of(row: SequenceLayout | Grid, cp_mesh: CpGroup, slicing: str = "chunks") -> TokenShard:
    """This rank's `TokenShard` of a packed row (its `SequenceLayout`) or of a plain batch's token grid;
    `slicing` as `Parallel.token_slicing` says for the profile's cp_impl."""
    group = cp_process_group(cp_mesh)
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    if isinstance(row, SequenceLayout):
        return TokenShard.of_layout(row, rank, size, slicing)
    return TokenShard.of_grid(tuple(row), rank, size, slicing)


def gather_row(x: torch.Tensor, shard: TokenShard, cp_mesh: CpGroup) -> torch.Tensor:
    """Every rank's tokens (B, local, ...) -> the full row (B, total, ...) in row order, pads dropped,
    on every rank (differentiable)."""
    return shard.assemble(gather_tokens(x, cp_process_group(cp_mesh)))


def shard_loss(elementwise: torch.Tensor, shard: TokenShard) -> torch.Tensor:
    """This rank's share of the micro-batch's mean loss, from the per-element loss of its tokens
    (B, local, features): the sum over its real tokens divided by the element count of the whole row
    (B * total * features). The shares of the cp ranks sum to the single-process mean exactly, pads
    excluded, however unevenly the pads fall. Gradients of replicated parameters then need a sum over
    cp: FSDP over dp_shard_cp averages instead, so backpropagate `shard.size * shard_loss(...)` there
    (and divide by the dp degree as usual, which FSDP's average also does)."""
    valid = shard.valid(elementwise.device).view(1, -1, *([1] * (elementwise.ndim - 2)))
    total = elementwise.shape[0] * shard.total * elementwise[0, 0].numel()
    zero = torch.zeros((), dtype=elementwise.dtype, device=elementwise.device)
    return torch.where(valid, elementwise, zero).sum() / total


def per_token(values: torch.Tensor, shard: TokenShard) -> torch.Tensor:
    """Per-sample values (N,) broadcast against this rank's tokens (B, local, features): (1, local, 1)
    for a packed row (each token its sample's value, pads their sample's), (B, 1, 1) for a plain batch.
    E.g. the noise level sigma_b of `edm.denoise` / `edm.loss` under context parallel."""
    if shard.packed:
        return values[shard.token_sample(values.device)][None, :, None]
    return values[:, None, None]
