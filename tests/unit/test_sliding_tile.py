"""Sliding-tile attention (vidforge.attention.sliding_tile) against an independent dense reference: a boolean
mask written from each token's (t, h, w) position with FastVideo's clamped-centre rule, and a plain softmax
in float64, for plain batches and packed rows, forward and backward; the FLOPs it skips against a direct
count of the masked pairs; the profile's window refused at load where it cannot run."""

from __future__ import annotations

import pytest
import torch

from vidforge.attention.dispatch import attention
from vidforge.attention.sliding_tile import attended_pairs
from vidforge.models import build_model, forward_flops, model_config, pack_latents
from vidforge.models.scopes import batch_scopes, packed_scopes, tile_scope
from vidforge.profile import ProfileError, load_profile
from vidforge.tokens import SequenceLayout, grid_positions

HEADS, DIM = 2, 4


def reference_mask(grid, tile, window) -> torch.Tensor:
    """(S, S) in t-major token order: FastVideo's rule (the window's centre tile clamped to half a window
    from the grid's edge), a window wider than the grid covering it all."""
    pos = grid_positions(grid).tolist()
    counts = [-(-g // c) for g, c in zip(grid, tile, strict=True)]
    out = torch.zeros(len(pos), len(pos), dtype=torch.bool)
    for i, q in enumerate(pos):
        for j, k in enumerate(pos):
            ok = True
            for a in range(3):
                qt, kt, n, w = q[a] // tile[a], k[a] // tile[a], counts[a], window[a]
                if w < n:
                    centre = min(max(qt, w // 2), n - 1 - w // 2)
                    ok = ok and abs(centre - kt) <= w // 2
            out[i, j] = ok
    return out


def masked_softmax(q, k, v, mask):
    scores = torch.einsum("qhd,khd->hqk", q, k) / DIM**0.5
    probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, v)


def _qkv(batch, tokens, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn(batch, tokens, HEADS, DIM, generator=g, dtype=torch.float64, requires_grad=True)
        for _ in range(3)
    ]


def _sta(q, k, v, full, tile, window, backend):
    scope = tile_scope(full, tile, window, q.device)
    out = attention(scope.gather(q), scope.gather(k), scope.gather(v), scope.mask, backend)
    return scope.scatter(out)


def _check_grads(out, ref, inputs):
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, inputs, grad)
    want = torch.autograd.grad(ref, inputs, grad)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


TILE, WINDOW = (2, 2, 3), (1, 3, 1)  # partial tiles on every axis of GRID_A; windows slide at the edges


@pytest.mark.parametrize("backend", ["sdpa", "dense"])
def test_plain_batch_equals_masked_reference_forward_and_backward(backend):
    grid = (3, 5, 7)
    q, k, v = _qkv(2, 105)
    out = _sta(q, k, v, batch_scopes(2, grid)["full"], TILE, WINDOW, backend)
    mask = reference_mask(grid, TILE, WINDOW)
    assert 0 < mask.float().mean() < 1
    ref = torch.stack([masked_softmax(q[b], k[b], v[b], mask) for b in range(2)])
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    _check_grads(out, ref, (q, k, v))


@pytest.mark.parametrize("backend", ["sdpa", "dense"])
def test_packed_row_equals_masked_reference_per_sample_forward_and_backward(backend):
    grids = ((3, 5, 7), (2, 4, 3))
    layout = SequenceLayout(grids)
    q, k, v = _qkv(1, layout.total, seed=1)
    out = _sta(q, k, v, packed_scopes(layout)["full"], TILE, WINDOW, backend)
    parts = []
    for start, end, grid in zip(layout.offsets[:-1], layout.offsets[1:], grids, strict=True):
        mask = reference_mask(grid, TILE, WINDOW)
        parts.append(masked_softmax(q[0, start:end], k[0, start:end], v[0, start:end], mask))
    ref = torch.cat(parts).unsqueeze(0)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    _check_grads(out, ref, (q, k, v))


def test_a_window_covering_every_tile_equals_full_attention():
    grid, layout = (3, 5, 7), SequenceLayout(((3, 5, 7), (2, 4, 3)))
    q, k, v = _qkv(2, 105, seed=2)
    out = _sta(q, k, v, batch_scopes(2, grid)["full"], TILE, (3, 5, 3), "sdpa")
    torch.testing.assert_close(out, attention(q, k, v, None, "dense"), rtol=1e-10, atol=1e-12)
    q, k, v = _qkv(1, layout.total, seed=3)
    full = packed_scopes(layout)["full"]
    out = _sta(q, k, v, full, TILE, (9, 9, 9), "sdpa")
    torch.testing.assert_close(out, attention(q, k, v, full.mask, "dense"), rtol=1e-10, atol=1e-12)


def test_flex_block_mask_builds_on_cpu_and_its_forward_equals_the_reference():
    # FlexAttention has no CPU backward: forward only here; its GPU run is not measured.
    layout = SequenceLayout(((3, 5, 7), (2, 4, 3)))
    q, k, v = (x.detach() for x in _qkv(1, layout.total, seed=4))
    full = packed_scopes(layout)["full"]
    scope = tile_scope(full, TILE, WINDOW, q.device)
    block = scope.mask.block_mask(q.device)
    assert block.shape[-2:] == (layout.total, layout.total)
    out = _sta(q, k, v, full, TILE, WINDOW, "flex")
    torch.testing.assert_close(out, _sta(q, k, v, full, TILE, WINDOW, "dense"), rtol=1e-10, atol=1e-12)


def test_tiles_of_128_tokens_are_whole_flex_blocks_and_the_windows_skip_the_rest():
    # Tile-major order puts a 128-token tile on one FlexAttention block: every block the windows touch is
    # full (no per-token mask work), and the skipped share equals the skipped pairs.
    grid, tile, window = (3, 16, 16), (1, 16, 8), (3, 1, 1)  # 3 x 1 x 2 tiles; each sees 3 of the 6
    scope = tile_scope(batch_scopes(1, grid)["full"], tile, window, torch.device("cpu"))
    block = scope.mask.block_mask(torch.device("cpu"))
    total = 3 * 16 * 16
    assert int(block.kv_num_blocks.sum()) == 0 and int(block.full_kv_num_blocks.sum()) == 6 * 3
    assert block.sparsity() == pytest.approx(100 * (1 - attended_pairs(grid, tile, window) / total**2))


@pytest.mark.parametrize(
    ("grid", "tile", "window"),
    [((3, 5, 7), (2, 2, 3), (1, 3, 1)), ((4, 6, 6), (2, 2, 2), (1, 1, 3)), ((5, 4, 4), (1, 4, 4), (3, 1, 1))],
)
def test_attended_pairs_equal_a_direct_count_of_the_mask(grid, tile, window):
    assert attended_pairs(grid, tile, window) == int(reference_mask(grid, tile, window).sum())
    assert attended_pairs(grid, tile, None) == (grid[0] * grid[1] * grid[2]) ** 2


def test_skipped_flops_equal_the_masked_pairs_per_windowed_layer():
    grids = [(3, 5, 7), (2, 4, 3)]
    windows = [[1, 3, 1], None, [3, 3, 1]]
    cfg = model_config("tiny", layers=3, attention_window=windows, attention_tile=TILE)
    full = forward_flops(model_config("tiny", layers=3), grids, 5)
    sta = forward_flops(cfg, grids, 5)
    masked = sum(int((~reference_mask(g, TILE, w)).sum()) for w in windows if w is not None for g in grids)
    assert sta.skipped_attention == 4 * cfg.hidden * masked  # QK^T and PV, 2 FLOPs a multiply-add
    assert full.parts["attention"] - sta.parts["attention"] == sta.skipped_attention
    assert sta.forward == full.forward - sta.skipped_attention


WAN_TINY = {"layers": 2, "hidden": 48, "heads": 4, "mlp_hidden": 96, "text_dim": 32, "in_channels": 4}


@pytest.mark.parametrize(
    ("preset", "shape"),
    [("tiny", {}), ("tiny", {"architecture": "stdit", "stdit_block": "parallel"}), ("wan2.1-1.3b", WAN_TINY)],
    ids=["dit", "stdit-parallel", "wan"],
)
def test_each_family_with_a_window_per_layer_runs_plain_and_packed_and_a_whole_window_changes_nothing(
    preset, shape
):
    torch.manual_seed(0)
    base = build_model(model_config(preset, **shape)).double()
    for p in base.parameters():  # adaLN-Zero starts every block as the identity: give attention a say
        torch.nn.init.normal_(p, std=0.2)
    tile = {"attention_tile": (1, 2, 2)}
    whole = build_model(model_config(preset, **shape, **tile, attention_window=(9, 9, 9))).double()
    local = build_model(model_config(preset, **shape, **tile, attention_window=[[1, 1, 1], None])).double()
    whole.load_state_dict(base.state_dict())
    local.load_state_dict(base.state_dict())
    x, n, t = torch.randn(2, 4, 3, 8, 8).double(), torch.rand(2).double(), torch.randn(2, 5, 32).double()
    reference = base(x, n, t)
    torch.testing.assert_close(whole(x, n, t), reference)
    assert (local(x, n, t) - reference).abs().max() > 1e-6
    tokens, layout = pack_latents([x[0], x[1, :, :2]], (1, 2, 2))
    packed = local(tokens, n, t, layout=layout)
    # each packed sample as its own plain batch: the same numbers (its own grid, its own windows)
    alone = local(x[1:, :, :2], n[1:], t[1:])
    torch.testing.assert_close(packed[:, 48:], pack_latents([alone[0]], (1, 2, 2))[0])


@pytest.mark.parametrize(
    ("sets", "words"),
    [
        (["model.attention_window=[2,3,3]"], "each odd"),
        (["model.attention_window=[[1,1,1]]"], "one entry per layer"),
        (["model.attention_window=[1,1,1]", "model.attention=flash"], "not flash"),
        (["model.attention_window=[1,1,1]", "model.architecture=stdit"], "no full video self-attention"),
        (
            [
                "model.attention_window=[1,1,1]",
                "model.attention_tile=[1,4,4]",
                "cluster.cpu_processes=2",
                "parallel.cp=2",
                "parallel.cp_impl=usp",
            ],
            "sliding-tile attention (model.attention_window) runs under cp_impl all-gather, ring, ulysses, "
            "not usp",
        ),
        # local_cpu samples 9 frames of 32x48: a token grid (3, 8, 12)
        (
            ["model.attention_window=[1,1,1]", "model.attention_tile=[1,8,16]"],
            "do not fit the token grid [3, 8, 12]",
        ),
    ],
)
def test_a_window_that_cannot_run_is_refused_at_load_in_one_line(sets, words):
    with pytest.raises(ProfileError) as refused:
        load_profile("local_cpu", sets)
    assert words in str(refused.value)


def test_the_demo_profile_loads_with_a_window_of_half_its_tiles():
    profile = load_profile("local_cpu", ["model.attention_window=[3,1,3]", "model.attention_tile=[1,4,4]"])
    assert profile.model.layer_window(0) == (3, 1, 3)
    count = forward_flops(profile.model, [(3, 8, 12)], 5)
    assert count.skipped_attention == 4 * profile.model.hidden * profile.model.layers * 288 * 144


@pytest.mark.parametrize("impl", ["all-gather", "ring", "ulysses"])
def test_a_window_loads_under_the_context_parallel_impls_that_apply_it(impl):
    sets = ["model.attention_window=[1,1,1]", "model.attention_tile=[1,4,4]", "cluster.cpu_processes=2"]
    profile = load_profile("local_cpu", [*sets, "parallel.cp=2", f"parallel.cp_impl={impl}"])
    assert profile.parallel.cp == 2


def test_a_cp_ranks_queries_against_the_row_under_flex_equal_the_masked_reference():
    # Context parallel's all-gather and Ulysses hand the dispatcher `TileRows`: its flex block mask builds
    # on the CPU (forward only there) and gives the masked reference's numbers, pad queries included.
    from vidforge.models.scopes import sharded_scopes
    from vidforge.tokens import TokenShard

    layout = SequenceLayout(((3, 5, 7), (2, 4, 3)))
    shard = TokenShard.of_layout(layout, 1, 2)
    scope = tile_scope(sharded_scopes(shard)["full"], TILE, WINDOW, torch.device("cpu"))
    rows = scope.mask.rows(torch.device("cpu"))
    q, k, v = (x.detach() for x in _qkv(1, layout.total, seed=5))
    q = shard.split(q)
    assert (rows.q_index < 0).any()  # a pad query among them
    flex = attention(q, k, v, rows, "flex")
    torch.testing.assert_close(flex, attention(q, k, v, rows, "sdpa"), rtol=1e-10, atol=1e-12)
