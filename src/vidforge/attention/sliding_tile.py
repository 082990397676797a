"""Sliding-tile attention (STA, Zhang et al. 2025, arXiv 2502.04507) for the full self-attention of video
tokens: the (t, h, w) token grid of a sample is cut into 3D tiles of `tile` tokens per axis, and every
query of a tile attends to the key tiles inside a window of `window` tiles per axis around its own tile.
At the grid's edge the window slides inward rather than shrinking (the kernel's centre is clamped, as in
NATTEN and FastVideo's reference mask), so every query tile sees the same number of key tiles; a window
larger than the grid along an axis covers all of it. Partial tiles at the grid's far edge are tiles too.

Tokens enter attention in tile-major order (tiles one after another, each tile's tokens contiguous), so
a tile of a multiple of FlexAttention's 128-token blocks maps onto whole blocks and the block mask skips
every block outside the windows (GPU, `model.attention=flex`). The `sdpa` and `dense` backends run the
exact masked reference: SDPA with the dense boolean mask, one call per sample of a packed row.

Under context parallel (`parallel.cp_impl` all-gather, ring or ulysses) each rank keeps its tokens in
the row order the `TokenShard` split gives; the row's mask is built in that order and names a rank's
tokens by `TokenShard.row_index` (`TiledShard`), so the windows hold whatever the split. All-gather and
Ulysses run queries against the gathered row under `TileRows` (the block mask or the masked
reference); the ring hands each K/V block its slice of the mask (`TiledShard.block`). A rank's chunk of
the row is not whole tiles, so on the GPU the flex block masks there are less sparse than the
single-process one (GPU: not measured).

What this module owns: the window rule (`TileMask.allowed`, used by the reference, the block mask and
the context-parallel masks), the tile-major order, and the attended-pair count `models/flops.py`
charges. The scope that applies it to a forward's tokens is `vidforge.models.scopes.tile_scope`; which
layers use it is the profile's (`model.attention_window`, `model.attention_tile`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from vidforge.errors import UserInputError
from vidforge.tokens import ContextShard, Grid, grid_positions

Triple = tuple[int, int, int]


def window_starts(tiles: torch.Tensor, count: int, window: int) -> torch.Tensor:
    """First key tile of each query tile's window along one axis of `count` tiles: centred on the
    query tile, slid inward at the edges (a window of more than `count` tiles covers them all)."""
    size = min(window, count)
    return (tiles - size // 2).clamp(0, count - size)


@dataclass(eq=False)
class TileMask:
    """Which keys each query of a row may see under sliding-tile attention, per token in the order the
    dispatcher receives them (tile-major). `tiles[a]`: the tile index of every token along axis a
    (t, h, w); `start[a]`/`stop[a]`: the key tiles [start, stop) its window covers as a query;
    `sample`: the sample of every token (all 0 in a plain batch, whose rows share one grid); `lens`:
    tokens per sample (host integers)."""

    tiles: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    start: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    stop: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    sample: torch.Tensor
    lens: tuple[int, ...]
    _cache: dict = field(default_factory=dict, repr=False)

    def allowed(self, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        """Whether query `q_idx` may see key `kv_idx` (broadcasting index tensors; also FlexAttention's
        mask_mod body)."""
        ok = self.sample[q_idx] == self.sample[kv_idx]
        for tiles, start, stop in zip(self.tiles, self.start, self.stop, strict=True):
            key = tiles[kv_idx]
            ok = ok & (start[q_idx] <= key) & (key < stop[q_idx])
        return ok

    def dense(self, start: int, end: int) -> torch.Tensor:
        """The (n, n) boolean mask of tokens [start, end) of the row (built once: the layers of a forward
        share the mask object)."""
        key = ("dense", start, end)
        if key not in self._cache:
            idx = torch.arange(start, end, device=self.sample.device)
            self._cache[key] = self.allowed(idx[:, None], idx[None, :])
        return self._cache[key]

    def block_mask(self, device: torch.device):
        """FlexAttention's BlockMask of the row (built once per device)."""
        key = ("flex", str(device))
        if key not in self._cache:
            from torch.nn.attention.flex_attention import create_block_mask

            mask = self if self.sample.device == torch.device(device) else self.to(device)

            def mask_mod(b, h, q_idx, kv_idx):
                return mask.allowed(q_idx, kv_idx)

            total = sum(self.lens)
            self._cache[key] = create_block_mask(mask_mod, None, None, total, total, device=device)
        return self._cache[key]

    def to(self, device: torch.device | str) -> TileMask:
        def move(axes):
            return tuple(t.to(device) for t in axes)

        return TileMask(
            move(self.tiles), move(self.start), move(self.stop), self.sample.to(device), self.lens
        )

    def reference(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The exact masked attention: SDPA with the dense boolean mask, one call per sample (a plain
        batch is one call, its rows sharing the mask). q, k, v: (B, S, heads, head_dim)."""
        outs, start = [], 0
        for n in self.lens:
            qs, ks, vs = (x[:, start : start + n].transpose(1, 2) for x in (q, k, v))
            mask = self.dense(start, start + n).to(q.device)
            outs.append(F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask).transpose(1, 2))
            start += n
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)


@dataclass(eq=False)
class TileRows:
    """Sliding-tile attention of some tokens of a row to all of its real tokens, for context parallel:
    the queries are named by `q_index`, their positions in the order of `tiles` (-1 for a context-parallel
    pad), and `q_sample`, their samples; the keys are the row's real tokens in that order. A pad query
    sees every real key of its sample (a finite output nobody reads); every real query sees at least its
    own token, so no row of the mask is empty."""

    tiles: TileMask
    q_index: torch.Tensor
    q_sample: torch.Tensor
    _cache: dict = field(default_factory=dict, repr=False)

    def allowed(self, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        """Whether query `q_idx` (a position among the queries) may see key `kv_idx` (a position in the
        row); broadcasting index tensors, also FlexAttention's mask_mod body."""
        index = self.q_index[q_idx]
        own = self.q_sample[q_idx] == self.tiles.sample[kv_idx]
        return torch.where(index >= 0, self.tiles.allowed(index.clamp(min=0), kv_idx), own)

    def dense(self) -> torch.Tensor:
        """The (queries, row) boolean mask (built once)."""
        if "dense" not in self._cache:
            q = torch.arange(self.q_index.shape[0], device=self.q_index.device)
            kv = torch.arange(self.tiles.sample.shape[0], device=self.q_index.device)
            self._cache["dense"] = self.allowed(q[:, None], kv[None, :])
        return self._cache["dense"]

    def block_mask(self, device: torch.device):
        """FlexAttention's BlockMask of the queries against the row (built once)."""
        if "flex" not in self._cache:
            from torch.nn.attention.flex_attention import create_block_mask

            def mask_mod(b, h, q_idx, kv_idx):
                return self.allowed(q_idx, kv_idx)

            lq, lk = self.q_index.shape[0], self.tiles.sample.shape[0]
            self._cache["flex"] = create_block_mask(mask_mod, None, None, lq, lk, device=device)
        return self._cache["flex"]

    def bias(self, dtype: torch.dtype) -> torch.Tensor:
        """The dense mask as SDPA's additive bias (0 or -inf) in `dtype` (built once per dtype)."""
        key = ("bias", dtype)
        if key not in self._cache:
            zero = torch.zeros(self.dense().shape, dtype=dtype, device=self.q_index.device)
            self._cache[key] = zero.masked_fill(~self.dense(), float("-inf"))
        return self._cache[key]

    def prepare(self, backend: str, q: torch.Tensor) -> None:
        """Build now what attention on `backend` will read (the block mask, or the reference's bias): a
        selectively checkpointed region (all-gather's re-gather) must replay its forward's ops exactly,
        and neither a cache being filled nor SDPA converting a boolean mask does that."""
        self.block_mask(q.device) if backend == "flex" else self.bias(q.dtype)

    def reference(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The exact masked attention, one SDPA call with the dense mask as a bias (samples apart by the
        mask). q: (B, queries, heads, head_dim); k, v: (B, row, heads, head_dim)."""
        bias = self.bias(q.dtype).to(q.device)
        qs, ks, vs = (x.transpose(1, 2) for x in (q, k, v))
        return F.scaled_dot_product_attention(qs, ks, vs, attn_mask=bias).transpose(1, 2)


@dataclass(eq=False)
class TiledShard(ContextShard):
    """Sliding-tile attention over a row split across context-parallel ranks: the `ContextShard` of full
    attention with the row's `TileMask` in row order (the order `TokenShard.row_index` names tokens in,
    so each rank's tokens map onto the mask by index whatever the split). What each cp implementation
    asks of it (`vidforge.parallel.cp_attention`), built once per forward and shared by its layers:
    `rows` (this rank's queries against the row: all-gather), `gathered_rows` (every rank's queries in
    gathered order: Ulysses), `block` (this rank's queries against rank `source`'s tokens: ring)."""

    tiles: TileMask
    _cache: dict = field(default_factory=dict, repr=False)

    def rows(self, device: torch.device) -> TileRows:
        key = ("rows", str(device))
        if key not in self._cache:
            index = self.shard.row_index(device)
            self._cache[key] = TileRows(self.tiles, index, self.shard.token_sample(device))
        return self._cache[key]

    def gathered_rows(self, device: torch.device) -> TileRows:
        key = ("gathered", str(device))
        if key not in self._cache:
            size = self.shard.size
            index = torch.cat([self.shard.row_index(device, r) for r in range(size)])
            self._cache[key] = TileRows(self.tiles, index, self.shard.token_sample(device).repeat(size))
        return self._cache[key]

    def block(self, source: int, device: torch.device, queries: slice) -> torch.Tensor:
        """(queries, local) bool: which of rank `source`'s tokens each of this rank's `queries` (a slice)
        sees; pads of `source` are no keys. Built per call, not kept: the ring asks by query chunk."""
        rows, kv = self.rows(device), self.shard.row_index(device, source)
        q = torch.arange(rows.q_index.shape[0], device=device)[queries]
        return rows.allowed(q[:, None], kv.clamp(min=0)[None, :]) & (kv >= 0)[None, :]


def tile_order(grid: Grid, tile: Triple) -> torch.Tensor:
    """Permutation of a sample's t-major tokens into tile-major order (tiles in t-major order of their
    indices, tokens t-major within a tile)."""
    pos = grid_positions(grid)
    tiles = pos // torch.tensor(tile)
    counts = [-(-g // c) for g, c in zip(grid, tile, strict=True)]
    tile_id = (tiles[:, 0] * counts[1] + tiles[:, 1]) * counts[2] + tiles[:, 2]
    # Stable sort: within a tile the t-major order of the tokens is kept.
    return torch.sort(tile_id, stable=True).indices


def tile_mask(grids: Sequence[Grid], tile: Triple, window: Triple | None, order: torch.Tensor) -> TileMask:
    """The TileMask of a row holding samples of `grids` (one grid for a plain batch), their tokens
    permuted by `order` (each sample's `tile_order`, offset to its place in the row); window None: every
    tile of the sample (video sparse attention's tiling, `vidforge.attention.video_sparse`)."""
    tiles, start, stop, sample = [[], [], []], [[], [], []], [[], [], []], []
    for i, grid in enumerate(grids):
        pos = grid_positions(grid)
        sample.append(torch.full((pos.shape[0],), i, dtype=torch.long))
        for a in range(3):
            count = -(-grid[a] // tile[a])
            size = count if window is None else min(window[a], count)
            axis = pos[:, a] // tile[a]
            first = window_starts(axis, count, size)
            tiles[a].append(axis)
            start[a].append(first)
            stop[a].append(first + size)

    def row(parts):
        return tuple(torch.cat(p)[order] for p in parts)

    lens = tuple(g[0] * g[1] * g[2] for g in grids)
    return TileMask(row(tiles), row(start), row(stop), torch.cat(sample)[order], lens)


def attended_pairs(grid: Grid, tile: Triple, window: Triple | None) -> int:
    """(query, key) pairs sliding-tile attention computes for one sample (all t*h*w squared without a
    window). The rule is a product over axes, so the count is: per axis, the sum over query positions of
    the key positions in their window."""
    total = 1
    for size, c, k in zip(grid, tile if window else grid, window or grid, strict=True):
        count = -(-size // c)
        axis = 0
        for q_tile in range(count):
            first = max(0, min(q_tile - min(k, count) // 2, count - min(k, count)))
            keys = min(size, (first + min(k, count)) * c) - first * c
            axis += (min(size, (q_tile + 1) * c) - q_tile * c) * keys
        total *= axis
    return total


def check_backend(backend: str) -> None:
    """flash-attn takes no arbitrary mask: refused (the profile refuses it at load; this is the guard
    for a model built by hand)."""
    if backend == "flash":
        raise UserInputError(
            "model.attention_window/attention_topk: tiled attention runs on attention=flex (GPU block mask) "
            "or sdpa/dense (masked reference), not flash"
        )


def set_windows(blocks, cfg) -> None:
    """Give each block's full self-attention layer (named by the block class's `full_attention`) its
    (tile, window) from the profile (`Model.layer_window`), or under video sparse attention
    (`model.attention_topk`) the tiling (window None) and its `topk`; a layer left alone attends in full."""
    for key, block in blocks.items():
        if cfg.attention_topk is not None:
            layer = getattr(block, block.full_attention)
            layer.tiles, layer.topk = (tuple(cfg.attention_tile), None), cfg.attention_topk
        elif (window := cfg.layer_window(int(key))) is not None:
            getattr(block, block.full_attention).tiles = (tuple(cfg.attention_tile), window)
