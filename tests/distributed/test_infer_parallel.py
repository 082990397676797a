"""Parallel inference on 2 gloo ranks against one process with the same model and inputs.

- CFG-parallel: the conditional branch on rank 0, the unconditional on rank 1, exchanged by one
  all-gather; the guided denoiser and whole sampled latents equal the one-batch single-process ones.
- ScaleFusion: ST-DiT denoising with the sequence split over frames, all-to-alls between the spatial
  and temporal layouts, and the sliced, overlapped schedule; equal to the plain (synchronous, unsliced)
  schedule and to the single-process forward.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ranks import run_ranks  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

LATENT_SHAPE = (4, 4, 8, 8)  # C, T, H, W: 4 x 4 x 4 tokens with patch (1, 2, 2)


def _tiny_model(**overrides):
    from vidforge.models import build_model, model_config

    torch.manual_seed(0)
    model = build_model(model_config("tiny", **overrides), dtype=torch.float64).eval()
    with torch.no_grad():  # adaLN-Zero starts every block at the identity: perturb so the test has teeth
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def _profile(*sets: str):
    from vidforge.profile import load_profile

    return load_profile("local_cpu", ["diffusion.steps=3", *sets])


def _captions(batch: int = 2):
    gen = torch.Generator().manual_seed(1)
    text = torch.randn(batch, 5, 32, generator=gen, dtype=torch.float64)
    mask = torch.ones(batch, 5, dtype=torch.bool)
    mask[1, 3:] = False
    negative = (torch.randn(1, 4, 32, generator=gen), torch.ones(1, 4, dtype=torch.bool))
    return text, mask, negative


def _by_value(results: dict[str, torch.Tensor]) -> dict:
    """Tensors as numpy arrays: a tensor put on run_ranks' queue travels as a shared-memory handle that
    the receiver can only open while the sending rank is still alive, which races with its exit."""
    return {name: value.detach().cpu().numpy() for name, value in results.items()}


def _as_tensors(per_rank: list[dict]) -> list[dict[str, torch.Tensor]]:
    return [{name: torch.from_numpy(value) for name, value in result.items()} for result in per_rank]


# --- CFG-parallel -------------------------------------------------------------------------------------


def _denoiser_input():
    x = torch.randn(2, *LATENT_SHAPE, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    return x, torch.tensor(2.0, dtype=torch.float64)


def _cfg_worker(rank: int, world: int) -> dict[str, torch.Tensor]:
    """Everything the CFG-parallel tests compare, from one launch of the two ranks."""
    import torch.distributed as dist

    from vidforge.diffusion import EDM
    from vidforge.diffusion.guidance import parallel_classifier_free_guidance
    from vidforge.infer.sampling import sample_latents

    model = _tiny_model()
    text, mask, negative = _captions()

    def batched(x, sigma, uncond):
        net = lambda x_in, c: model(x_in, c, text, mask, drop_text=uncond)  # noqa: E731
        return EDM().denoise(net, x, sigma.expand(x.shape[0]))

    out = {}
    with torch.no_grad():
        out["denoiser"] = parallel_classifier_free_guidance(batched, 4.0, dist.group.WORLD)(
            *_denoiser_input()
        )
    for name, neg in (("null", None), ("negative", negative)):
        out[name] = sample_latents(
            model,
            _profile("diffusion.guidance=4.0"),
            text,
            mask,
            [3, 4],
            LATENT_SHAPE,
            neg,
            cfg_group=dist.group.WORLD,
        )
    return _by_value(out)


@pytest.fixture(scope="module")
def cfg_results() -> list[dict[str, torch.Tensor]]:
    return _as_tensors(run_ranks(_cfg_worker, 2))


def test_cfg_parallel_denoiser_equals_one_batch_guidance(cfg_results) -> None:
    from vidforge.diffusion import EDM, model_denoiser

    model = _tiny_model()
    text, mask, _ = _captions()
    with torch.no_grad():
        reference = model_denoiser(model, EDM(), text, mask, guidance=4.0)(*_denoiser_input())
    # float64 model. The ranks run batches of 2 rows where the reference runs 4, so matmul blocking
    # differs in the last bits (measured: 2e-15 apart, not bitwise equal): 1e-12 is float64 rounding.
    for result in cfg_results:
        torch.testing.assert_close(result["denoiser"], reference, rtol=1e-12, atol=1e-12)
    assert torch.equal(cfg_results[0]["denoiser"], cfg_results[1]["denoiser"])  # both mix the same answers


@pytest.mark.parametrize("unconditional", ["null", "negative"])
def test_cfg_parallel_sample_equals_single_process_sample(cfg_results, unconditional: str) -> None:
    from vidforge.infer.sampling import sample_latents

    text, mask, negative = _captions()
    reference = sample_latents(
        _tiny_model(),
        _profile("diffusion.guidance=4.0"),
        text,
        mask,
        [3, 4],
        LATENT_SHAPE,
        negative if unconditional == "negative" else None,
    )
    # The sampler state is float32 (sample_latents casts the network's output to float32), so a
    # last-bit float64 difference can round one float32 element the other way: float32 tolerance.
    for result in cfg_results:
        torch.testing.assert_close(result[unconditional], reference, rtol=1e-5, atol=1e-5)
    assert torch.equal(cfg_results[0][unconditional], cfg_results[1][unconditional])


# --- ScaleFusion --------------------------------------------------------------------------------------

ST_LATENT = (4, 8, 8, 8)  # C, T, H, W: 8 frames x 4 x 4 positions; 4 frames and 8 positions per rank
SLICINGS = {
    "plain": (1, 1, 1, 1),
    "default": (4, 4, 1, 3),  # N_T, N_S, L_T, L_S: the defaults
    "uneven": (3, 2, 2, 2),  # frame slices of 2, 1, 1 frames; the first of each all-to-all in 2 parts
}


def _st_inputs():
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, *ST_LATENT, generator=gen, dtype=torch.float64)
    noise_level = torch.tensor([0.3, -0.2], dtype=torch.float64)
    text, mask, _ = _captions()
    return x, noise_level, text, mask, torch.tensor([False, True])


def _scalefusion_worker(rank: int, world: int) -> dict[str, torch.Tensor]:
    import torch.distributed as dist

    from vidforge.parallel.scalefusion import ScaleFusionSlicing, scalefusion_forward

    model = _tiny_model(architecture="stdit")
    x, noise_level, text, mask, drop = _st_inputs()
    return _by_value(
        {
            name: scalefusion_forward(
                model,
                x,
                noise_level,
                text,
                mask,
                drop_text=drop,
                group=dist.group.WORLD,
                slicing=ScaleFusionSlicing(*numbers),
            )
            for name, numbers in SLICINGS.items()
        }
    )


@pytest.fixture(scope="module")
def scalefusion_results() -> list[dict[str, torch.Tensor]]:
    return _as_tensors(run_ranks(_scalefusion_worker, 2))


def test_scalefusion_plain_schedule_equals_single_process_forward(scalefusion_results) -> None:
    model = _tiny_model(architecture="stdit")
    x, noise_level, text, mask, drop = _st_inputs()
    with torch.no_grad():
        reference = model(x, noise_level, text, mask, drop_text=drop)
    # float64; spatial and temporal attention see the same tokens, only in other batch groupings
    for result in scalefusion_results:
        torch.testing.assert_close(result["plain"], reference, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("slicing", ["default", "uneven"])
def test_scalefusion_overlapped_schedule_equals_plain_schedule(scalefusion_results, slicing: str) -> None:
    for result in scalefusion_results:
        assert torch.equal(result[slicing], result["plain"])
