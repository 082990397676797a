"""Exact parameter counts of a model section, by the parts the memory and communication models treat
differently: what every block holds, what tensor parallel splits, and what sits outside the blocks."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from torch import nn

from vidforge.profile.model import Model

# Block submodules whose Linear layers tensor parallel splits (column-wise q/k/v/fc1/fc3, row-wise
# out/fc2, as `vidforge.models.layers` documents); norms and the AdaLN modulation stay replicated.
TP_SPLIT_PARENTS = ("self_attn", "cross_attn", "spatial_attn", "temporal_attn", "full_attn", "mlp")


@dataclass(frozen=True)
class ParameterCounts:
    total: int
    block: int
    """Parameters of one transformer block (all blocks are alike)."""
    block_tp: int
    """Of those, the ones tensor parallel splits."""
    outside: int
    """Patch and caption embeddings, timestep MLP, shared modulation, null caption, final layer."""
    linear_weights: int
    """Weights of every nn.Linear: what bf16 autocast casts and keeps for the backward."""
    layers: int


@functools.lru_cache(maxsize=64)
def parameter_counts(cfg: Model) -> ParameterCounts:
    """Counted on a model built on the meta device: no memory, exact for every preset."""
    from vidforge.models import build_model

    model = build_model(cfg, device="meta")
    block = next(iter(model.blocks.values()))
    block_total = sum(p.numel() for p in block.parameters())
    block_tp = sum(
        p.numel()
        for name, p in block.named_parameters()
        if name.split(".")[0] in TP_SPLIT_PARENTS and "norm" not in name.split(".")[-2]
    )
    total = sum(p.numel() for p in model.parameters())
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    return ParameterCounts(
        total=total,
        block=block_total,
        block_tp=block_tp,
        outside=total - cfg.layers * block_total,
        linear_weights=linear,
        layers=cfg.layers,
    )
