"""Video sparse attention (VSA, Zhang et al. 2025, arXiv 2505.13389): trainable block-sparse attention
for the full self-attention of video tokens, on the tiles of sliding-tile attention (`model.attention_tile`,
tokens in tile-major order: `vidforge.attention.sliding_tile`).

1. Coarse pass: each tile's queries and keys are mean-pooled, and every query tile scores every key tile
   of its sample (pooled q . pooled k), per head; the `topk` highest key tiles are its selection (all of
   its sample's tiles where it has fewer). The selection is a choice, not a function to differentiate:
   it runs without gradients, as in the paper.
2. Fine pass: exact softmax attention of each query over the keys of its tile's selected tiles. The
   gradients reach q, k and v (and through them the projections' parameters) through this pass, so
   fine-tuning with it on teaches the model to live with the selection, which is the paper's point.

The fine pass runs as the dispatcher runs sliding-tile attention: FlexAttention's block mask built from
the selection under `model.attention=flex` (GPU; per batch row and head, a tile of a multiple of 128
tokens being whole blocks), the exact masked reference (SDPA under the dense (B, H, S, S) mask) under
sdpa and dense. Not here: the paper's coarse-attention output gated into the result (a gate projection
the published weights lack), and context parallel (the selection needs every rank's pooled tiles; the
rulebook refuses cp > 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from vidforge.attention.sliding_tile import TileMask, Triple
from vidforge.errors import UserInputError
from vidforge.tokens import Grid


def tile_ids(mask: TileMask) -> tuple[torch.Tensor, int]:
    """(S,) the row-wide index of every token's tile (tokens in tile-major order, so a tile's tokens are
    contiguous: a new tile starts wherever a tile index or the sample changes), and the tile count."""
    key = ("tile ids",)
    if key not in mask._cache:
        change = torch.zeros_like(mask.sample, dtype=torch.bool)
        for axis in (*mask.tiles, mask.sample):
            change[1:] |= axis[1:] != axis[:-1]
        ids = torch.cumsum(change.long(), 0)
        mask._cache[key] = (ids, int(ids[-1]) + 1)
    return mask._cache[key]


def pool_tiles(x: torch.Tensor, ids: torch.Tensor, count: int) -> torch.Tensor:
    """Mean of x (B, S, H, D) over each tile's tokens: (B, count, H, D)."""
    sums = x.new_zeros((x.shape[0], count, *x.shape[2:])).index_add_(1, ids, x)
    sizes = torch.bincount(ids, minlength=count).to(x.dtype)
    return sums / sizes[None, :, None, None]


@dataclass(eq=False)
class TileSelection:
    """Which key tiles each query tile attends to, per batch row and head: `selected` (B, H, n, n) over
    the row's `n` tiles (`tile_ids`), never across samples; `ids`: each token's tile."""

    ids: torch.Tensor
    selected: torch.Tensor
    _cache: dict = field(default_factory=dict, repr=False)

    def allowed(self, b, h, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        """Whether query `q_idx` of row `b`, head `h` sees key `kv_idx` (FlexAttention's mask_mod body)."""
        return self.selected[b, h, self.ids[q_idx], self.ids[kv_idx]]

    def dense(self) -> torch.Tensor:
        """(B, H, S, S) boolean mask of the fine pass."""
        if "dense" not in self._cache:
            self._cache["dense"] = self.selected[:, :, self.ids][:, :, :, self.ids]
        return self._cache["dense"]

    def block_mask(self, device: torch.device):
        """FlexAttention's BlockMask of the selection (built once)."""
        if "flex" not in self._cache:
            from torch.nn.attention.flex_attention import create_block_mask

            def mask_mod(b, h, q_idx, kv_idx):
                return self.allowed(b, h, q_idx, kv_idx)

            batch, heads = self.selected.shape[:2]
            length = self.ids.shape[0]
            self._cache["flex"] = create_block_mask(mask_mod, batch, heads, length, length, device=device)
        return self._cache["flex"]

    def reference(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The exact masked fine pass: SDPA under the dense mask (every query sees at least its top
        tile). q, k, v: (B, S, heads, head_dim)."""
        qs, ks, vs = (x.transpose(1, 2) for x in (q, k, v))
        mask = self.dense().to(q.device)
        return F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask).transpose(1, 2)


def select_tiles(mask, q: torch.Tensor, k: torch.Tensor, topk: int) -> TileSelection:
    """The coarse pass over q, k (B, S, H, D) in the tile-major order of `mask` (a `TileMask` from
    `scopes.tile_scope`): per row and head, each query tile's `topk` key tiles of its sample by pooled
    q . pooled k. Runs without gradients."""
    if not isinstance(mask, TileMask):
        raise UserInputError(
            "model.attention_topk: video sparse attention has no context-parallel plan; set parallel.cp=1"
        )
    ids, count = tile_ids(mask)
    with torch.no_grad():
        scores = torch.einsum("bqhd,bkhd->bhqk", pool_tiles(q, ids, count), pool_tiles(k, ids, count))
        sample = torch.zeros(count, dtype=mask.sample.dtype, device=ids.device).index_copy_(
            0, ids, mask.sample
        )
        same = sample[:, None] == sample[None, :]
        scores = scores.masked_fill(~same, float("-inf"))
        top = scores.topk(min(topk, count), dim=-1).indices
        selected = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, top, True) & same
    return TileSelection(ids, selected)


def selected_pairs(grid: Grid, tile: Triple, topk: int) -> int:
    """(query, key) pairs video sparse attention computes for one sample, as charged: every query sees
    `topk` whole tiles (all of the sample where it has fewer), plus the coarse pass's tile pairs. The
    grid's partial edge tiles make the true count lower when they are selected."""
    tokens = grid[0] * grid[1] * grid[2]
    tiles = 1
    for size, c in zip(grid, tile, strict=True):
        tiles *= -(-size // c)
    volume = min(tile[0], grid[0]) * min(tile[1], grid[1]) * min(tile[2], grid[2])
    return tokens * min(tokens, topk * volume) + tiles * tiles
