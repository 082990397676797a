"""Sliding-tile attention under context parallel (all-gather, its re-gather variant, ring, Ulysses) on 2
gloo ranks against one process, in float64.

- The attention alone (the ring also in query chunks of 16; all-gather with re-gather runs in
  test_context_parallel's spawn, where the selective checkpointing is imported already): random q, k, v of a plain batch (2 rows of a 3 x 5 x 7 grid: 105 tokens, a pad at
  cp 2) and of a packed row (3 x 5 x 7 + 2 x 4 x 3 tokens), split with `TokenShard`, windowed through the
  model's own path (`sharded_scopes` -> `tile_scope`) and run by `ContextParallelAttend`; the gathered
  output and the gradients of q, k and v equal a masked softmax written out per sample, its mask built
  from each token's (t, h, w) position by FastVideo's rule (`test_sliding_tile.reference_mask`). The
  tile and window leave partial tiles on every axis and windows that slide at the edges, so most
  (query rank, key rank) blocks are partly masked and some query rows see no key of the other rank.
- A tiny DiT with windows on its layers: the EDM loss's output, loss shares and every parameter's
  gradient against the single-process model (test_context_parallel's `_case`), a packed row and a plain
  batch with pads.

float64: the two computations differ in summation order only, so 1e-10 bounds rounding and catches any
real error (a missing key or a wrong gradient path is O(1e-2)). One spawn runs every case.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "unit"))
from ranks import run_ranks  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

IMPLS = ("all-gather", "ring", "ring chunked", "ulysses")  # all-gather regather: test_context_parallel
ROWS = {"plain": ((3, 5, 7),), "packed": ((3, 5, 7), (2, 4, 3))}
TILE, WINDOW = (2, 2, 3), (1, 3, 1)
DIT_IMPLS, DIT_ROWS = ("all-gather", "ring", "ulysses"), ("packed", "plain padded")  # test_context_parallel's
HEADS, DIM = 2, 4
TOL = 1e-10


def _row(kind: str):
    """Full-row q, k, v and the output gradient (B, S, H, D), the same on every rank."""
    grids = ROWS[kind]
    batch = 2 if kind == "plain" else 1
    total = sum(t * h * w for t, h, w in grids)
    g = torch.Generator().manual_seed(5)
    return [torch.randn(batch, total, HEADS, DIM, generator=g, dtype=torch.float64) for _ in range(4)]


def attention_case(kind: str, impl: str, group) -> dict[str, torch.Tensor]:
    """This rank's sliding-tile attention under context parallel, gathered: output and input gradients."""
    from vidforge.attention.dispatch import Attend
    from vidforge.models.scopes import sharded_scopes, tile_scope
    from vidforge.parallel.context_parallel import (
        ContextParallelAttend,
        cp_process_group,
        gather_row,
        shard_of,
    )
    from vidforge.parallel.cp_attention import ring_attention
    from vidforge.tokens import SequenceLayout

    group = cp_process_group(group)  # a cp mesh or its process group
    grids = ROWS[kind]
    shard = shard_of(SequenceLayout(grids) if kind == "packed" else grids[0], group)
    q, k, v, grad = _row(kind)
    local = [shard.split(x).requires_grad_() for x in (q, k, v)]
    scope = tile_scope(sharded_scopes(shard)["full"], TILE, WINDOW, torch.device("cpu"))
    name, _, variant = impl.partition(" ")
    if variant == "chunked":  # the ring's einsum kernel in query chunks, each asking for its rows of the mask
        out = ring_attention(
            *(scope.gather(x) for x in local), shard, group, query_chunk=16, tiles=scope.mask
        )
    else:
        attend = ContextParallelAttend(Attend("sdpa"), group, name, regather=variant == "regather")
        out = attend(*(scope.gather(x) for x in local), scope.mask)
    out.backward(shard.split(grad))
    result = {"output": gather_row(scope.scatter(out).detach(), shard, group)}
    for label, x in zip(("q", "k", "v"), local, strict=True):
        result[label] = gather_row(x.grad, shard, group)
    return result


def _model(window):
    from vidforge.models import build_model, model_config

    cfg = model_config(
        "tiny",
        hidden=32,
        heads=4,
        layers=2,
        mlp_hidden=64,
        patch=[1, 1, 1],
        adaln_lora_rank=4,
        attention_tile=(1, 1, 2),
        attention_window=window,
    )
    torch.manual_seed(0)
    model = build_model(cfg, dtype=torch.float64)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # off the zero initialisation, so every parameter matters
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def _worker(rank: int, world: int):
    import torch.distributed as dist
    from test_context_parallel import _case

    group = dist.group.WORLD
    attention = {(impl, kind): attention_case(kind, impl, group) for impl in IMPLS for kind in ROWS}
    model = _model([[1, 1, 1], [3, 1, 1]])  # one token tile per query on the first layer
    dit = {(impl, kind): _case(model, impl, kind, group) for impl in DIT_IMPLS for kind in DIT_ROWS}
    return {"attention": attention, "dit": dit}


@pytest.fixture(scope="module")
def results():
    return run_ranks(_worker, 2)


@functools.cache  # every impl's test compares with it
def reference(kind: str):
    """Masked softmax per sample, written out, and its gradients for the same output gradient."""
    from test_sliding_tile import reference_mask

    q, k, v, grad = (x.requires_grad_(i < 3) for i, x in enumerate(_row(kind)))
    outs, start = [], 0
    for grid in ROWS[kind]:
        n = grid[0] * grid[1] * grid[2]
        qs, ks, vs = (x[:, start : start + n] for x in (q, k, v))
        scores = torch.einsum("bqhd,bkhd->bhqk", qs, ks) / DIM**0.5
        scores = scores.masked_fill(~reference_mask(grid, TILE, WINDOW), float("-inf"))
        outs.append(torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), vs))
        start += n
    out = torch.cat(outs, 1)
    out.backward(grad)
    return {"output": out.detach(), "q": q.grad, "k": k.grad, "v": v.grad}


@pytest.mark.parametrize("kind", ROWS)
@pytest.mark.parametrize("impl", IMPLS)
def test_two_ranks_equal_the_dense_masked_reference_forward_and_backward(results, impl, kind):
    want = reference(kind)
    for rank in results:
        got = rank["attention"][(impl, kind)]
        for name, value in want.items():
            torch.testing.assert_close(got[name], value, rtol=TOL, atol=TOL, msg=f"{name} differs")


@pytest.mark.parametrize("kind", DIT_ROWS)
@pytest.mark.parametrize("impl", DIT_IMPLS)
def test_a_windowed_dit_under_two_ranks_matches_one_process(results, impl, kind):
    """Output, loss and parameter gradients of a DiT with sliding-tile layers equal the single process."""
    for rank in results:
        errors = rank["dit"][(impl, kind)]
        assert errors["output"] < TOL
        assert errors["loss"] < TOL
        assert errors["grad"] < TOL + TOL * errors["grad_scale"]
        assert errors["grad_scale"] > 1e-3
