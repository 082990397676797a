"""Tiled attention's FlexAttention block masks on the device in bf16 against the masked reference in
float64 on the CPU, forward and backward: sliding-tile attention (`TileMask`), a context-parallel rank's
queries against the row (`TileRows`) and video sparse attention's fine pass (`TileSelection`, the
selection made on the device and handed to the reference as it is, so only the fine pass is compared).
Tiles of 128 tokens (whole flex blocks), a packed row of two samples."""

from __future__ import annotations

import pytest
import torch
from gpu_device import rel_error

from vidforge.attention.dispatch import attention
from vidforge.attention.video_sparse import TileSelection, select_tiles
from vidforge.models.scopes import packed_scopes, sharded_scopes, tile_scope
from vidforge.tokens import SequenceLayout, TokenShard

pytestmark = pytest.mark.gpu

HEADS, DIM = 4, 64
GRIDS = ((4, 16, 16), (2, 16, 8))  # 1 x 16 x 8 tiles: 4 x 2 and 2 x 1 of them
TILE, WINDOW, TOPK = (1, 16, 8), (3, 1, 1), 3


def _inputs(tokens: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, tokens, HEADS, DIM, generator=g, dtype=torch.float64) for _ in range(4)]


def _compare(device, q, k, v, grad, mask_on_device, mask_on_cpu):
    reference = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = attention(*reference, mask_on_cpu, "sdpa")
    ref.backward(grad)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    backward = device.type == "cuda"  # FlexAttention has no CPU backward
    ours = [t.to(device, dtype).requires_grad_(backward) for t in (q, k, v)]
    out = attention(*ours, mask_on_device, "flex")
    assert rel_error(out, ref) < 2e-2
    if backward:
        out.backward(grad.to(device, dtype))
        for mine, theirs in zip(ours, reference, strict=True):
            assert rel_error(mine.grad, theirs.grad) < 3e-2


def test_sliding_tile_block_mask_matches_the_float64_reference(device):
    layout = SequenceLayout(GRIDS)
    q, k, v, grad = _inputs(layout.total, 0)
    full = packed_scopes(layout)["full"]
    on_device = tile_scope(full, TILE, WINDOW, device).mask
    _compare(device, q, k, v, grad, on_device, tile_scope(full, TILE, WINDOW, torch.device("cpu")).mask)


def test_a_cp_ranks_rows_block_mask_matches_the_float64_reference(device):
    layout = SequenceLayout(GRIDS)
    shard = TokenShard.of_layout(layout, 1, 2)
    q, k, v, grad = _inputs(layout.total, 1)
    q, grad = shard.split(q), shard.split(grad)
    scopes = (
        tile_scope(sharded_scopes(shard)["full"], TILE, WINDOW, d) for d in (device, torch.device("cpu"))
    )
    on_device, on_cpu = (s.mask.rows(d) for s, d in zip(scopes, (device, torch.device("cpu")), strict=True))
    _compare(device, q, k, v, grad, on_device, on_cpu)


def test_video_sparse_fine_pass_block_mask_matches_the_float64_reference(device):
    layout = SequenceLayout(GRIDS)
    q, k, v, grad = _inputs(layout.total, 2)
    scope = tile_scope(packed_scopes(layout)["full"], TILE, None, device)
    qd, kd = (scope.gather(t.to(device, torch.bfloat16)) for t in (q, k))
    selection = select_tiles(scope.mask, qd, kd, TOPK)
    on_cpu = TileSelection(selection.ids.cpu(), selection.selected.cpu())
    order = scope.order.cpu()
    _compare(device, *(t[:, order] for t in (q, k, v, grad)), selection, on_cpu)
