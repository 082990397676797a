"""Tensor parallel for the wan family (Wan2.1's transformer, `vidforge.models.wan`), on the `tp` mesh.

Inside every block: attention q/k/v (self and cross) and the feed-forward's first projection are
column-parallel (a rank computes its heads and its slice of the inner width; attention reads the head
count from the projection width), attention `to_out.0` and the feed-forward's `net.2` are row-parallel
(partial sums, all-reduced). Wan's q and k RMS norms normalise across *all* heads (diffusers'
`norm_q`/`norm_k` over the whole hidden size), so a rank's share cannot be normalised alone: each rank
sums the squares of its features, the sums are all-reduced (differentiably), and each rank scales its
features by the whole row's RMS and its shard of the norm weight (a DTensor sharded like the projection's
columns, so checkpoints and the export see the whole weight). Everything else (norms on the residual
stream, the modulation table, the time and text embedders, the output layer) stays replicated on the tp
ranks, with gradients that are complete on every rank because they act on replicated data.

No sequence parallel for this family yet (the layout rulebook refuses it with tp > 1).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from vidforge.errors import UserInputError
from vidforge.models.wan import WanAttention, WanTransformer


class HeadsSpanningRMSNorm(nn.Module):
    """`nn.RMSNorm` over a feature dimension split across the tp ranks: the mean square of the whole
    row's features (all-reduced), each rank's shard of the weight."""

    def __init__(self, norm: nn.RMSNorm, mesh: DeviceMesh) -> None:
        super().__init__()
        (self.features,) = norm.normalized_shape
        self.eps = norm.eps if norm.eps is not None else torch.finfo(torch.float32).eps
        self.group = mesh.get_group()
        self.weight = nn.Parameter(distribute_tensor(norm.weight.detach(), mesh, [Shard(0)]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        squares = x.float().square().sum(dim=-1, keepdim=True)
        mean = dist_fn.all_reduce(squares, op=dist.ReduceOp.SUM, group=self.group) / self.features
        return (x.float() * torch.rsqrt(mean + self.eps)).type_as(x) * self.weight.to_local()

    def __deepcopy__(self, memo: dict) -> HeadsSpanningRMSNorm:
        # A process group cannot be copied: copies of the model (EMA, evaluation) share it.
        clone = object.__new__(HeadsSpanningRMSNorm)
        nn.Module.__init__(clone)
        clone.features, clone.eps, clone.group = self.features, self.eps, self.group
        clone.weight = nn.Parameter(self.weight.detach().clone(), requires_grad=self.weight.requires_grad)
        return clone


def _attention(attn: WanAttention, mesh: DeviceMesh) -> None:
    parallelize_module(
        attn,
        mesh,
        {
            "to_q": ColwiseParallel(),
            "to_k": ColwiseParallel(),
            "to_v": ColwiseParallel(),
            "to_out.0": RowwiseParallel(),
        },
    )
    attn.norm_q = HeadsSpanningRMSNorm(attn.norm_q, mesh)
    attn.norm_k = HeadsSpanningRMSNorm(attn.norm_k, mesh)


def apply_wan_tp(model: WanTransformer, tp_mesh: DeviceMesh) -> None:
    """Tensor parallel over the 1-D `tp_mesh`, in place, before activation checkpointing, compile and
    FSDP. Weights are taken from tp rank 0, so a model initialised before this call keeps its values."""
    tp, cfg = tp_mesh.size(), model.config
    for name, value in (("heads", cfg.heads), ("mlp_hidden", cfg.mlp_hidden)):
        if value % tp:
            raise UserInputError(
                f"parallel.tp={tp} must divide model.{name}={value}; change tp or the model shape"
            )
    for block in model.blocks.values():
        _attention(block.attn1, tp_mesh)
        _attention(block.attn2, tp_mesh)
        parallelize_module(block.ffn, tp_mesh, {"net.0.proj": ColwiseParallel(), "net.2": RowwiseParallel()})
