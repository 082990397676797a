"""Classifier-free guidance: one batch holds both branches, and the mix is uncond + w (cond - uncond)."""

import pytest
import torch

from vidforge.diffusion import EDM, classifier_free_guidance
from vidforge.models import build_model, model_config
from vidforge.profile import load_profile
from vidforge.sampling.latents import guided_denoiser


def _batched_with_log(log):
    def batched(x, sigma, uncond):
        log.append(x.shape[0])
        # A toy denoiser whose conditional and unconditional answers differ.
        return torch.where(uncond[:, None], x * 0.5, x * 2.0 + 1.0)

    return batched


@pytest.mark.parametrize("scale", [0.0, 3.0, 7.5])
def test_guided_output_mixes_the_branches(scale):
    log = []
    x = torch.randn(4, 6, dtype=torch.float64)
    out = classifier_free_guidance(_batched_with_log(log), scale)(x, torch.tensor(1.0))
    cond, uncond = x * 2.0 + 1.0, x * 0.5
    torch.testing.assert_close(out, uncond + scale * (cond - uncond))
    assert log == [8]  # one call, conditional and unconditional together


def test_scale_one_runs_only_the_conditional_branch():
    log = []
    x = torch.randn(4, 6)
    out = classifier_free_guidance(_batched_with_log(log), 1.0)(x, torch.tensor(1.0))
    torch.testing.assert_close(out, x * 2.0 + 1.0)
    assert log == [4]


def test_guided_denoiser_uses_the_null_caption_for_the_unconditional_half():
    torch.manual_seed(0)
    model = build_model(model_config("tiny"), dtype=torch.float64)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    edm = EDM()
    x = torch.randn(2, 4, 1, 4, 4, dtype=torch.float64)
    text = torch.randn(2, 3, 32, dtype=torch.float64)
    sigma = torch.tensor(2.0, dtype=torch.float64)
    profile = load_profile("local_cpu", ["diffusion.guidance=4.0"])
    mask = torch.ones(2, 3, dtype=torch.bool)
    guided = guided_denoiser(model, profile, text, mask, dtype=torch.float64)(x, sigma)

    def branch(drop):
        net = lambda x_in, c: model(x_in, c, text, mask, drop_text=torch.full((2,), drop))  # noqa: E731
        return edm.denoise(net, x, sigma.expand(2))

    cond, uncond = branch(False), branch(True)
    # the guided denoiser reads the network output in float32
    torch.testing.assert_close(guided, uncond + 4.0 * (cond - uncond), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(cond, uncond)
