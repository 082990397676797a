"""Context parallel (all-gather, ring, Ulysses) on 2 and 4 gloo ranks against one process.

Every rank builds the same tiny float64 DiT and the same inputs, runs the single-process model as the
reference, then the context-parallel copy on its share of the tokens (`TokenShard`), for a packed row
whose samples do not divide by the cp degree (so pads are exercised) and for a plain batch. Checked:
the gathered output equals the single-process output, the ranks' `shard_loss` shares sum to the
single-process mean loss, and every parameter's gradient, summed over the ranks, equals the
single-process gradient. float64 throughout: the two computations differ in summation order only, so
1e-10 (relative and absolute) bounds rounding with a wide margin and catches any real error (a missing
key, a wrong gradient path is O(1e-2) or larger). Context-parallel sampling (several denoising steps
with classifier-free guidance) must give the single-process latents: the sampler runs in float32, so
there the tolerance is 1e-5.

One spawn per group size runs every case, and the tests read its results: on this 2-core machine each
spawn costs seconds of process start-up.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ranks import run_ranks  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

IMPLS = ("all-gather", "ring", "ulysses")
TOL = {"rtol": 1e-10, "atol": 1e-10}


def _model():
    from vidforge.models import build_model, model_config

    cfg = model_config(
        "tiny", hidden=32, heads=4, layers=2, mlp_hidden=64, patch=[1, 1, 1], adaln_lora_rank=4
    )
    torch.manual_seed(0)
    model = build_model(cfg, dtype=torch.float64)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # off the zero initialisation, so every parameter matters
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def _inputs(packed: bool):
    """Model inputs in row order (tokens, per-sample conditioning), the `layout` or `grid`, and a target."""
    from vidforge.models import pack_latents, patchify

    g = torch.Generator().manual_seed(2)
    if packed:  # 12 + 3 + 9 tokens: 3 and 9 leave pads at cp 2 and 4
        shapes = [(4, 2, 2, 3), (4, 1, 1, 3), (4, 3, 1, 3)]
        latents = [torch.randn(s, generator=g, dtype=torch.float64) for s in shapes]
        tokens, layout = pack_latents(latents, (1, 1, 1))
        row = {"layout": layout}
    else:  # two clips of 3 x 1 x 3 = 9 tokens
        latents = torch.randn(2, 4, 3, 1, 3, generator=g, dtype=torch.float64)
        tokens, row = patchify(latents, (1, 1, 1)), {"grid": (3, 1, 3)}
    n = 3 if packed else 2
    text = torch.randn(n, 5, 32, generator=g, dtype=torch.float64)
    text_mask = torch.ones(n, 5, dtype=torch.bool)
    text_mask[0, 3:] = False
    drop = torch.zeros(n, dtype=torch.bool)
    drop[-1] = True  # one sample uses the null caption
    cond = (torch.randn(n, generator=g, dtype=torch.float64), text, text_mask)
    target = torch.randn(tokens.shape, generator=g, dtype=torch.float64)
    return tokens, cond, drop, row, target


def _case(model, impl: str, packed: bool, group) -> dict[str, float]:
    """Largest errors of the cp run against the single-process one: output, loss, gradients."""
    import torch.distributed as dist

    from vidforge.parallel.context_parallel import apply_cp, gather_row, shard_loss, shard_of

    tokens, cond, drop, row, target = _inputs(packed)
    reference = copy.deepcopy(model)
    out = reference(tokens, *cond, drop_text=drop, **row)
    loss = ((out - target) ** 2).mean()
    loss.backward()

    cp_model = apply_cp(copy.deepcopy(model), group, impl)
    shard = shard_of(row.get("layout") or row.get("grid"), group)
    local = cp_model(shard.split(tokens), *cond, drop_text=drop, shard=shard)
    share = shard_loss((local - shard.split(target)) ** 2, shard)
    share.backward()
    total = share.detach().clone()
    dist.all_reduce(total, group=group)
    errors = {
        "output": (gather_row(local.detach(), shard, group) - out.detach()).abs().max().item(),
        "loss": (total - loss.detach()).abs().item(),
        "grad": 0.0,
        "grad_scale": max(p.grad.abs().max().item() for p in reference.parameters()),
    }
    for p, q in zip(cp_model.parameters(), reference.parameters(), strict=True):
        grad = p.grad.clone()
        dist.all_reduce(grad, group=group)
        errors["grad"] = max(errors["grad"], (grad - q.grad).abs().max().item())
    return errors


def _sampling(model, impl: str, group) -> float:
    """Largest difference between context-parallel and single-process sampled latents."""
    from vidforge.infer.sampling import sample_latents
    from vidforge.parallel.context_parallel import apply_cp, sample_latents_cp
    from vidforge.profile import load_profile

    profile = load_profile(None, ["diffusion.steps=3", "diffusion.guidance=2.0", "diffusion.sampler=heun"])
    g = torch.Generator().manual_seed(3)
    text = torch.randn(2, 4, 32, generator=g)
    text_mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    shape = (4, 3, 1, 3)  # 9 tokens: padded on 2 and 4 ranks
    single = sample_latents(model, profile, text, text_mask, [5, 6], shape)
    cp_model = apply_cp(copy.deepcopy(model), group, impl)
    cp = sample_latents_cp(cp_model, profile, text, text_mask, [5, 6], shape, group)
    assert cp.shape == single.shape == (2, *shape)
    return (cp - single).abs().max().item()


def _worker(rank: int, world: int, impls: tuple[str, ...], sampling_impl: str | None):
    import torch.distributed as dist

    group = dist.group.WORLD
    model = _model()
    results = {}
    for impl in impls:
        for packed in (True, False):
            results[(impl, packed)] = _case(model, impl, packed, group)
    if sampling_impl:
        results["sampling"] = _sampling(model, sampling_impl, group)
    return results


@pytest.fixture(scope="module")
def two_ranks():
    return run_ranks(_worker, 2, IMPLS, "ring")


@pytest.fixture(scope="module")
def four_ranks():
    return run_ranks(_worker, 4, ("ulysses",), None)


def _check(errors):
    assert errors["output"] < TOL["atol"]
    assert errors["loss"] < TOL["atol"]
    assert errors["grad"] < TOL["atol"] + TOL["rtol"] * errors["grad_scale"]
    assert errors["grad_scale"] > 1e-3  # the gradients compared are not trivially zero


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "plain"])
@pytest.mark.parametrize("impl", IMPLS)
def test_two_ranks_match_one_process(two_ranks, impl, packed):
    """Output, loss and parameter gradients of 2-rank context parallel equal the single process."""
    for rank_errors in two_ranks:
        _check(rank_errors[(impl, packed)])


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "plain"])
def test_four_ranks_ulysses_match_one_process(four_ranks, packed):
    """4 ranks (one head per rank, samples shorter than 4 tokens per rank) equal the single process."""
    for rank_errors in four_ranks:
        _check(rank_errors[("ulysses", packed)])


def test_context_parallel_sampling_matches_one_process(two_ranks):
    """Heun sampling with guidance, the latent tokens split over 2 ranks at every step and gathered at
    the end, gives the single-process latents (float32 sampler state: 1e-5)."""
    for rank_errors in two_ranks:
        assert rank_errors["sampling"] < 1e-5
