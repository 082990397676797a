"""ST-DiT hybrid context parallel (parallel.cp_impl=st-hybrid) on 2 gloo ranks against one process.

Each rank runs the same float64 tiny ST-DiT on its `TokenShard` of the row (whole frames of every
sample) with `apply_st_hybrid` installed: spatial attention local, temporal attention between two
all-to-alls, the parallel block's full attention by all-gathered K/V. The gathered output and every
parameter gradient (summed over the ranks, as FSDP over dp_shard_cp does) must equal the unsharded
model's, for sequential and parallel ST-DiT blocks, plain batches and packed rows.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ranks import run_ranks  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

BLOCKS = ("sequential", "parallel")
ROWS = ("plain", "packed")
PLAIN_GRID = (4, 2, 4)  # T, H, W tokens: 2 frames and 4 positions per rank
PACKED_GRIDS = ((2, 2, 4), (4, 2, 2))  # two samples of 16 tokens, every T and H*W even


def _model(block: str):
    from vidforge.models import build_model, model_config

    torch.manual_seed(0)
    model = build_model(model_config("tiny", architecture="stdit", stdit_block=block), dtype=torch.float64)
    with torch.no_grad():  # adaLN-Zero starts every block at the identity: perturb so the test has teeth
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def _inputs(rows: str):
    """Tokens, how they are laid out (grid or SequenceLayout), conditioning, and loss weights."""
    from vidforge.models import SequenceLayout

    gen = torch.Generator().manual_seed(3)
    if rows == "plain":
        row, batch, total, samples = PLAIN_GRID, 2, PLAIN_GRID[0] * PLAIN_GRID[1] * PLAIN_GRID[2], 2
    else:
        row = SequenceLayout(PACKED_GRIDS)
        batch, total, samples = 1, row.total, row.num_samples
    tokens = torch.randn(batch, total, 16, generator=gen, dtype=torch.float64)  # patch (1,2,2) x 4 channels
    noise_level = torch.tensor([0.4, -0.3], dtype=torch.float64)[:samples]
    text = torch.randn(samples, 5, 32, generator=gen, dtype=torch.float64)
    mask = torch.ones(samples, 5, dtype=torch.bool)
    mask[-1, 2:] = False
    drop = torch.tensor([False, True])[:samples]
    weights = torch.randn(batch, total, 16, generator=gen, dtype=torch.float64)
    return tokens, row, (noise_level, text, mask, drop), weights


def _layout_kwargs(row) -> dict:
    from vidforge.models import SequenceLayout

    return {"layout": row} if isinstance(row, SequenceLayout) else {"grid": row}


def _by_value(out: torch.Tensor, grads: dict[str, torch.Tensor]) -> dict:
    # numpy arrays travel by value through run_ranks' queue (a tensor is a shared-memory handle that
    # races with the sending rank's exit)
    return {"out": out.detach().numpy(), "grads": {name: g.numpy() for name, g in grads.items()}}


def _worker(rank: int, world: int) -> dict[str, dict]:
    import torch.distributed as dist

    from vidforge.parallel.context_parallel import gather_row, shard_of
    from vidforge.parallel.stdit_parallel import apply_st_hybrid

    results = {}
    for block in BLOCKS:
        model = apply_st_hybrid(_model(block), dist.group.WORLD)
        for rows in ROWS:
            model.zero_grad(set_to_none=True)
            tokens, row, (noise_level, text, mask, drop), weights = _inputs(rows)
            shard = shard_of(row, dist.group.WORLD)
            out = model(shard.split(tokens), noise_level, text, mask, drop_text=drop, shard=shard)
            (out * shard.split(weights)).sum().backward()
            grads = {}
            for name, p in model.named_parameters():
                if p.grad is not None:  # every rank's tokens touch the same parameters
                    dist.all_reduce(p.grad)
                    grads[name] = p.grad
            results[f"{block}-{rows}"] = _by_value(gather_row(out.detach(), shard, dist.group.WORLD), grads)
    return results


@pytest.fixture(scope="module")
def hybrid_results() -> list[dict[str, dict]]:
    return run_ranks(_worker, 2)


def _single_process(block: str, rows: str):
    model = _model(block)
    tokens, row, (noise_level, text, mask, drop), weights = _inputs(rows)
    out = model(tokens, noise_level, text, mask, drop_text=drop, **_layout_kwargs(row))
    (out * weights).sum().backward()
    return out.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("block", BLOCKS)
def test_st_hybrid_output_and_gradients_equal_single_process(hybrid_results, block: str, rows: str) -> None:
    out, grads = _single_process(block, rows)
    # float64: the ranks attend over the same keys in other groupings and sum gradients over 2 ranks,
    # so only the order of float64 additions differs (measured ~1e-15); 1e-10 leaves room, far below
    # any real difference (a token in the wrong place changes values at the 1e-2 level).
    for result in hybrid_results:
        got = result[f"{block}-{rows}"]
        torch.testing.assert_close(torch.from_numpy(got["out"]), out, rtol=1e-10, atol=1e-10)
        assert set(got["grads"]) == set(grads)
        for name, grad in grads.items():
            torch.testing.assert_close(
                torch.from_numpy(got["grads"][name]), grad, rtol=1e-10, atol=1e-10, msg=name
            )
