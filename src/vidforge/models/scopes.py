"""Attention scopes: which tokens attend to which, expressed as a regrouping of the token row plus a
mask for the dispatcher.

- `full`: every token of a sample attends to every token of the same sample (DiT).
- `spatial`: tokens of one frame attend to each other (ST-DiT).
- `temporal`: tokens at one (h, w) position attend across frames (ST-DiT).

A plain batch (B equal grids) regroups by reshaping, so the dispatcher sees a bigger batch of short
sequences and no mask; a packed row keeps B = 1 and passes `Segments` (temporal first permutes tokens
so that each position's frames are contiguous). Under context parallel a rank holds part of every
sample (`TokenShard`): its scopes regroup nothing and hand the shard to the context-parallel attention.
q, k, v are (B, S, heads, head_dim) throughout.
"""

from __future__ import annotations

from dataclasses import dataclass
from weakref import WeakKeyDictionary

import torch

from vidforge.attention.dispatch import AttentionMask
from vidforge.attention.sliding_tile import TiledShard, Triple, tile_mask, tile_order
from vidforge.tokens import ContextShard, Grid, SequenceLayout, TokenShard

SCOPES = ("full", "spatial", "temporal")


@dataclass(eq=False)
class Scope:
    """One way of grouping tokens for attention. `gather` maps (B, S, H, D) to the dispatcher's
    (B', S', H, D); `scatter` maps the result back; `mask` goes to the dispatcher."""

    name: str
    mask: AttentionMask = None
    batch: int = 1
    grid: Grid | None = None
    order: torch.Tensor | None = None  # packed temporal: permutation into (h, w, t) order
    inverse: torch.Tensor | None = None
    grids: tuple[Grid, ...] | None = None  # packed full: each sample's grid (for `tile_scope`)

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        if self.order is not None:
            return x[:, self.order]
        if self.grid is None or self.name == "full":
            return x
        b, _, heads, dim = x.shape
        t, h, w = self.grid
        if self.name == "spatial":
            return x.reshape(b * t, h * w, heads, dim)
        return x.reshape(b, t, h * w, heads, dim).transpose(1, 2).reshape(b * h * w, t, heads, dim)

    def scatter(self, x: torch.Tensor) -> torch.Tensor:
        if self.inverse is not None:
            return x[:, self.inverse]
        if self.grid is None or self.name == "full":
            return x
        t, h, w = self.grid
        heads, dim = x.shape[2], x.shape[3]
        if self.name == "spatial":
            return x.reshape(self.batch, t * h * w, heads, dim)
        return (
            x.reshape(self.batch, h * w, t, heads, dim)
            .transpose(1, 2)
            .reshape(self.batch, t * h * w, heads, dim)
        )


def batch_scopes(batch: int, grid: Grid) -> dict[str, Scope]:
    """Scopes for a plain batch of `batch` samples that share one token grid."""
    return {name: Scope(name, None, batch, tuple(grid)) for name in SCOPES}


def packed_scopes(layout: SequenceLayout, device: torch.device | str = "cpu") -> dict[str, Scope]:
    """Scopes for one packed row."""
    order = layout.temporal_order(device)
    return {
        "full": Scope("full", layout.segments(), grids=layout.grids),
        "spatial": Scope("spatial", layout.frame_segments()),
        "temporal": Scope("temporal", layout.position_segments(), order=order, inverse=torch.argsort(order)),
    }


def sharded_scopes(shard: TokenShard) -> dict[str, Scope]:
    """Scopes for this rank's tokens of a row split over context-parallel ranks: no regrouping here (the
    tokens of a sample are spread over ranks); each mask is a `ContextShard` naming the scope, for the
    context-parallel attention that `apply_cp` (full) or ST-DiT sequence parallel (spatial, temporal:
    `apply_st_hybrid`, `apply_st_spatial`) installs."""
    return {name: Scope(name, ContextShard(name, shard)) for name in SCOPES}


# Per full scope (one per forward), so the layers of a forward that share a window share its scope.
_TILED: WeakKeyDictionary[Scope, dict[tuple[Triple, Triple], Scope]] = WeakKeyDictionary()


def tile_scope(full: Scope, tile: Triple, window: Triple | None, device: torch.device) -> Scope:
    """Sliding-tile attention over the tokens of the `full` scope (`vidforge.attention.sliding_tile`): the
    row permuted into tile-major order, sample by sample, and a `TileMask` for the dispatcher (window
    None: every tile, the tiling video sparse attention selects from)."""
    built = _TILED.setdefault(full, {})
    if (tile, window) in built:
        return built[(tile, window)]
    if isinstance(full.mask, ContextShard):
        # Context parallel: the rank's tokens stay in place (row order) and the mask, in row order, names
        # them by `TokenShard.row_index`; the cp attention applies it (`TiledShard`).
        shard = full.mask.shard
        grids = shard.layout.grids
        mask = tile_mask(grids, tile, window, torch.arange(shard.total)).to(device)
        scope = Scope("tiles", TiledShard("full", shard, mask))
        built[(tile, window)] = scope
        return scope
    grids = full.grids or (full.grid,)
    order, start = [], 0
    for grid in grids:
        order.append(start + tile_order(grid, tile))
        start += grid[0] * grid[1] * grid[2]
    order = torch.cat(order)
    mask = tile_mask(grids, tile, window, order).to(device)
    scope = Scope("tiles", mask, full.batch, None, order.to(device), torch.argsort(order).to(device))
    built[(tile, window)] = scope
    return scope
