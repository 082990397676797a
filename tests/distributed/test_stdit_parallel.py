"""ST-DiT sequence parallel (parallel.cp_impl=st-hybrid, and st-spatial below) on 2 gloo ranks against
one process.

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

    return _row_inputs(PLAIN_GRID if rows == "plain" else SequenceLayout(PACKED_GRIDS))


def _row_inputs(row):
    """`_inputs` of a plain batch of 2 samples of the token grid `row`, or of a packed row (its layout)."""
    from vidforge.models import SequenceLayout

    gen = torch.Generator().manual_seed(3)
    if isinstance(row, SequenceLayout):
        batch, total, samples = 1, row.total, row.num_samples
    else:
        batch, total, samples = 2, row[0] * row[1] * row[2], 2
    tokens = torch.randn(batch, total, 16, generator=gen, dtype=torch.float64)  # patch (1,2,2) x 4 channels
    noise_level = torch.tensor([0.4, -0.3, 1.1], dtype=torch.float64)[:samples]
    text = torch.randn(samples, 5, 32, generator=gen, dtype=torch.float64)
    mask = torch.ones(samples, 5, dtype=torch.bool)
    mask[-1, 2:] = False
    drop = torch.tensor([False, True, False])[:samples]
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
    from vidforge.parallel.stdit_parallel import apply_st_hybrid

    return _sharded_runs(apply_st_hybrid, {rows: _inputs(rows) for rows in ROWS}, "chunks")


def _sharded_runs(apply, inputs: dict, slicing: str) -> dict[str, dict]:
    """Each block's model with `apply` installed, run on this rank's shard of every named input: the
    gathered output and the gradients summed over the ranks, keyed "block-name"."""
    import torch.distributed as dist

    from vidforge.parallel.context_parallel import gather_row, shard_of

    results = {}
    for block in BLOCKS:
        model = apply(_model(block), dist.group.WORLD)
        for name, (tokens, row, (noise_level, text, mask, drop), weights) in inputs.items():
            model.zero_grad(set_to_none=True)
            shard = shard_of(row, dist.group.WORLD, slicing)
            out = model(shard.split(tokens), noise_level, text, mask, drop_text=drop, shard=shard)
            (out * shard.split(weights)).sum().backward()
            grads = {}
            for param, p in model.named_parameters():
                if p.grad is not None:  # every rank's tokens touch the same parameters
                    dist.all_reduce(p.grad)
                    grads[param] = p.grad
            results[f"{block}-{name}"] = _by_value(gather_row(out.detach(), shard, dist.group.WORLD), grads)
    return results


def _both_workers(rank: int, world: int) -> dict[str, dict]:
    # one pair of processes for both slicings: starting them costs more than the tiny models' work
    return {"hybrid": _worker(rank, world), "spatial": _spatial_worker(rank, world)}


@pytest.fixture(scope="module")
def both_results() -> list[dict[str, dict]]:
    return run_ranks(_both_workers, 2)


@pytest.fixture(scope="module")
def hybrid_results(both_results) -> list[dict[str, dict]]:
    return [result["hybrid"] for result in both_results]


def _single_process(block: str, inputs):
    model = _model(block)
    tokens, row, (noise_level, text, mask, drop), weights = inputs
    out = model(tokens, noise_level, text, mask, drop_text=drop, **_layout_kwargs(row))
    (out * weights).sum().backward()
    return out.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("block", BLOCKS)
def test_st_hybrid_output_and_gradients_equal_single_process(hybrid_results, block: str, rows: str) -> None:
    _assert_ranks_equal(hybrid_results, f"{block}-{rows}", *_single_process(block, _inputs(rows)))


def _assert_ranks_equal(results: list[dict[str, dict]], key: str, out: torch.Tensor, grads: dict) -> None:
    # float64: the ranks attend over the same keys in other groupings and sum gradients over 2 ranks,
    # so only the order of float64 additions differs (measured ~1e-15); 1e-10 leaves room, far below
    # any real difference (a token in the wrong place changes values at the 1e-2 level).
    for result in results:
        got = result[key]
        torch.testing.assert_close(torch.from_numpy(got["out"]), out, rtol=1e-10, atol=1e-10)
        assert set(got["grads"]) == set(grads)
        for name, grad in grads.items():
            torch.testing.assert_close(
                torch.from_numpy(got["grads"][name]), grad, rtol=1e-10, atol=1e-10, msg=name
            )


# --- spatial slicing (parallel.cp_impl=st-spatial): images and odd frame counts -------------------------

# Latent frame counts 1, 5 and 9 (an image, 17 and 33 video frames), which st-hybrid cannot split over 2
# ranks; 3x3 and 1x3 positions do not divide by 2 either, so pad columns are exercised.
SPATIAL_ROWS = {
    "1-frame": (1, 3, 3),
    "5-frame": (5, 2, 3),
    "9-frame": (9, 1, 3),
    "packed-1-5-9": ((1, 2, 2), (5, 3, 3), (9, 1, 2)),
}


def _spatial_row(name: str):
    from vidforge.models import SequenceLayout

    row = SPATIAL_ROWS[name]
    return SequenceLayout(row) if isinstance(row[0], tuple) else row


def _spatial_worker(rank: int, world: int) -> dict[str, dict]:
    from vidforge.parallel.st_spatial import apply_st_spatial

    inputs = {name: _row_inputs(_spatial_row(name)) for name in SPATIAL_ROWS}
    return _sharded_runs(apply_st_spatial, inputs, "positions")


@pytest.fixture(scope="module")
def spatial_results(both_results) -> list[dict[str, dict]]:
    return [result["spatial"] for result in both_results]


@pytest.mark.parametrize("name", list(SPATIAL_ROWS))
@pytest.mark.parametrize("block", BLOCKS)
def test_st_spatial_output_and_gradients_equal_single_process(spatial_results, block: str, name: str) -> None:
    """Each rank holds (h, w) positions of every frame: temporal attention local, spatial (and the
    parallel block's full) attention head-parallel. Output and summed gradients equal one process's, to
    float64 rounding as above, for images, 5- and 9-frame latents and a packed row of all three."""
    reference = _single_process(block, _row_inputs(_spatial_row(name)))
    _assert_ranks_equal(spatial_results, f"{block}-{name}", *reference)
