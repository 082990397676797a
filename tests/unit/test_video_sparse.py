"""Video sparse attention (vidforge.attention.video_sparse) against a slow direct computation written from
each token's (t, h, w) position: per row, head and sample, the tiles' mean-pooled queries and keys, each
query tile's top-k key tiles, and a softmax over the keys of those tiles, in float64, forward and
backward, for a plain batch and a packed row; a model's gradients through the fine pass; the FLOPs it
charges against the mask it builds; the profile refusing what cannot run."""

from __future__ import annotations

import pytest
import torch

from vidforge.attention.dispatch import attention
from vidforge.attention.video_sparse import select_tiles, selected_pairs
from vidforge.models import build_model, forward_flops, model_config
from vidforge.models.scopes import batch_scopes, packed_scopes, tile_scope
from vidforge.profile import ProfileError, load_profile
from vidforge.tokens import SequenceLayout, grid_positions

HEADS, DIM = 2, 4
TILE, TOPK = (1, 2, 3), 3  # partial tiles along h and w of GRID_A


def direct(q, k, v, grids):
    """q, k, v (B, S, H, D) in t-major order, samples one after another: VSA written out token by token."""
    out = torch.zeros_like(q)
    start = 0
    for grid in grids:
        n = grid[0] * grid[1] * grid[2]
        pos = grid_positions(grid).tolist()
        tile_of = [tuple(p[a] // TILE[a] for a in range(3)) for p in pos]
        tiles = sorted(set(tile_of))
        members = {t: [i for i in range(n) if tile_of[i] == t] for t in tiles}
        for b in range(q.shape[0]):
            for h in range(HEADS):
                qs, ks, vs = (x[b, start : start + n, h] for x in (q, k, v))
                pooled_q = {t: qs[members[t]].detach().mean(0) for t in tiles}
                pooled_k = {t: ks[members[t]].detach().mean(0) for t in tiles}
                for t in tiles:
                    scores = torch.stack([pooled_q[t] @ pooled_k[u] for u in tiles])
                    chosen = [tiles[j] for j in scores.topk(min(TOPK, len(tiles))).indices.tolist()]
                    keys = [i for u in chosen for i in members[u]]
                    for i in members[t]:
                        weights = torch.softmax(ks[keys] @ qs[i] / DIM**0.5, 0)
                        out[b, start + i, h] = weights @ vs[keys]
        start += n
    return out


def _qkv(batch, tokens, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn(batch, tokens, HEADS, DIM, generator=g, dtype=torch.float64, requires_grad=True)
        for _ in range(3)
    ]


def _vsa(q, k, v, full, backend):
    scope = tile_scope(full, TILE, None, q.device)
    qg, kg, vg = scope.gather(q), scope.gather(k), scope.gather(v)
    return scope.scatter(attention(qg, kg, vg, select_tiles(scope.mask, qg, kg, TOPK), backend))


def _check(out, ref, inputs):
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    grad = torch.randn_like(out)
    for a, b in zip(
        torch.autograd.grad(out, inputs, grad), torch.autograd.grad(ref, inputs, grad), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


GRID_A, GRID_B = (2, 3, 5), (1, 2, 2)  # 2 x 2 x 2 tiles (partial ones on h and w); 1 x 1 x 1 tile


@pytest.mark.parametrize("backend", ["sdpa", "dense"])
def test_plain_batch_equals_the_direct_computation_forward_and_backward(backend):
    q, k, v = _qkv(2, 30)
    out = _vsa(q, k, v, batch_scopes(2, GRID_A)["full"], backend)
    _check(out, direct(q, k, v, [GRID_A]), (q, k, v))


def test_packed_row_equals_the_direct_computation_per_sample_forward_and_backward():
    # The second sample has fewer tiles than topk: it attends to all of them, never to the first's.
    layout = SequenceLayout((GRID_A, GRID_B))
    q, k, v = _qkv(1, layout.total, seed=1)
    out = _vsa(q, k, v, packed_scopes(layout)["full"], "sdpa")
    _check(out, direct(q, k, v, [GRID_A, GRID_B]), (q, k, v))


def test_flex_block_mask_of_the_selection_equals_the_reference_forward():
    # FlexAttention has no CPU backward: forward only here; its GPU run is not measured.
    q, k, v = (x.detach() for x in _qkv(2, 30, seed=2))
    full = batch_scopes(2, GRID_A)["full"]
    torch.testing.assert_close(
        _vsa(q, k, v, full, "flex"), _vsa(q, k, v, full, "sdpa"), rtol=1e-10, atol=1e-12
    )


def test_the_charged_pairs_are_the_masks_pairs_on_whole_tiles():
    grid, tile, topk = (2, 4, 6), (1, 2, 3), 3  # 2 x 2 x 2 whole tiles of 6 tokens
    q, k, v = (x.detach() for x in _qkv(1, 48, seed=3))
    scope = tile_scope(batch_scopes(1, grid)["full"], tile, None, q.device)
    selection = select_tiles(scope.mask, scope.gather(q), scope.gather(k), topk)
    fine = int(selection.dense()[0, 0].sum())
    assert fine == 48 * topk * 6
    assert selected_pairs(grid, tile, topk) == fine + 8 * 8  # plus the coarse pass's tile pairs
    cfg = model_config("tiny", attention_topk=topk, attention_tile=tile)
    count = forward_flops(cfg, [grid], 5)
    assert count.skipped_attention == cfg.layers * 4 * cfg.hidden * (
        48 * 48 - selected_pairs(grid, tile, topk)
    )


WAN_TINY = {"layers": 2, "hidden": 48, "heads": 4, "mlp_hidden": 96, "text_dim": 32, "in_channels": 4}


@pytest.mark.parametrize(
    ("preset", "shape", "layer", "weights"),
    [
        ("tiny", {"layers": 2}, "self_attn", ("q", "k", "v")),
        ("wan2.1-1.3b", WAN_TINY, "attn1", ("to_q", "to_k", "to_v")),
    ],
    ids=["dit", "wan"],
)
def test_a_model_trains_through_the_fine_pass_and_every_tile_selected_is_full_attention(
    preset, shape, layer, weights
):
    torch.manual_seed(0)
    base = build_model(model_config(preset, **shape)).double()
    for p in base.parameters():  # adaLN-Zero starts every block as the identity: give attention a say
        torch.nn.init.normal_(p, std=0.2)
    tile = {"attention_tile": (1, 2, 2)}
    every = build_model(model_config(preset, **shape, attention_topk=16, **tile)).double()
    sparse = build_model(model_config(preset, **shape, attention_topk=2, **tile)).double()
    every.load_state_dict(base.state_dict())
    sparse.load_state_dict(base.state_dict())
    x, n, t = torch.randn(2, 4, 3, 8, 8).double(), torch.rand(2).double(), torch.randn(2, 5, 32).double()
    torch.testing.assert_close(every(x, n, t), base(x, n, t))
    out = sparse(x, n, t)
    assert (out - base(x, n, t)).abs().max() > 1e-6
    out.square().mean().backward()
    # q and k reach the loss only through the fine pass (the selection takes no gradient).
    attn = getattr(sparse.blocks["0"], layer)
    for name in weights:
        grad = getattr(attn, name).weight.grad
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().max() > 0


@pytest.mark.parametrize(
    ("sets", "words"),
    [
        (["model.attention_topk=0"], "greater than or equal to 1"),
        (["model.attention_topk=2", "model.attention_window=[1,1,1]"], "two sparse patterns"),
        (["model.attention_topk=2", "model.attention=flash"], "not flash"),
        (["model.attention_topk=2", "model.architecture=stdit"], "no full video self-attention"),
        (
            [
                "model.attention_topk=2",
                "model.attention_tile=[1,4,4]",
                "cluster.cpu_processes=2",
                "parallel.cp=2",
            ],
            "video sparse attention (model.attention_topk) has no context-parallel plan",
        ),
    ],
)
def test_what_cannot_run_is_refused_at_load_in_one_line(sets, words):
    with pytest.raises(ProfileError) as refused:
        load_profile("local_cpu", sets)
    assert words in str(refused.value)
