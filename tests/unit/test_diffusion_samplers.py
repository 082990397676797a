"""Samplers against Gaussian data, where the ideal denoiser and the exact ODE solution are known:
for data ~ N(mu, s0^2), D(x; sigma) = mu + s0^2 / (s0^2 + sigma^2) (x - mu), and the probability-flow
ODE carries x(sigma_max) to mu + (x - mu) s0 / sqrt(s0^2 + sigma_max^2)."""

import math

import pytest
import torch

from vidforge.diffusion import heun_sampler, karras_sigmas, res_sampler, sample
from vidforge.profile import Diffusion

MU, S0, SIGMA_MAX = 0.3, 0.5, 80.0


def gaussian_denoiser(x, sigma):
    return MU + S0**2 / (S0**2 + sigma**2) * (x - MU)


def exact_flow(noise):
    return MU + (noise * SIGMA_MAX - MU) * S0 / math.sqrt(S0**2 + SIGMA_MAX**2)


NOISE = torch.randn(50_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


@pytest.mark.parametrize(
    "name,run",
    [
        ("heun", lambda sig: heun_sampler(gaussian_denoiser, NOISE, sig)),
        ("res", lambda sig: res_sampler(gaussian_denoiser, NOISE, sig)),
        (
            "heun-churn",
            lambda sig: heun_sampler(
                gaussian_denoiser,
                NOISE,
                sig,
                churn=10.0,
                churn_sigma_min=0.05,
                churn_sigma_max=50.0,
                generator=torch.Generator().manual_seed(1),
            ),
        ),
    ],
)
def test_samplers_reproduce_the_target_distribution(name, run):
    out = run(karras_sigmas(64, 0.002, SIGMA_MAX, 7.0))
    assert out.mean().item() == pytest.approx(MU, abs=0.01), name
    assert out.std().item() == pytest.approx(S0, rel=0.02), name


def _errors(sampler, steps):
    noise = torch.linspace(-3, 3, 61, dtype=torch.float64)
    out = sampler(gaussian_denoiser, noise, karras_sigmas(steps, 0.002, SIGMA_MAX, 7.0))
    return (out - exact_flow(noise)).abs().max().item()


@pytest.mark.parametrize("sampler", [heun_sampler, res_sampler])
def test_error_falls_about_4x_when_steps_double(sampler):
    """Second order: halving the step size divides the global error by about 2^2."""
    e32, e64, e128 = (_errors(sampler, n) for n in (32, 64, 128))
    assert 3.5 < e32 / e64 < 5.0
    assert 3.5 < e64 / e128 < 4.6
    assert e128 < 3e-3


def test_euler_would_be_first_order():
    """Control: the same harness sees a first-order method as first order (error halves), so the 4x
    above is the corrector's doing."""

    def euler(denoise, noise, sigmas):
        x = noise * sigmas[0]
        for s, s_next in zip(sigmas[:-1], sigmas[1:], strict=True):
            x = x + (s_next - s) * (x - denoise(x, s)) / s
        return x

    ratio = _errors(euler, 64) / _errors(euler, 128)
    assert 1.7 < ratio < 2.5


def test_heun_uses_2n_minus_1_evaluations_and_res_n():
    calls = []

    def counting(x, sigma):
        calls.append(float(sigma))
        return gaussian_denoiser(x, sigma)

    sigmas = karras_sigmas(8, 0.002, SIGMA_MAX)
    heun_sampler(counting, NOISE[:4], sigmas)
    assert len(calls) == 15 and 0.0 not in calls
    # The corrector evaluates at the next sigma (a true Heun step), the predictor at the current one.
    assert calls[:3] == pytest.approx([float(sigmas[0]), float(sigmas[1]), float(sigmas[1])])
    calls.clear()
    res_sampler(counting, NOISE[:4], sigmas)
    assert len(calls) == 8


def test_sample_dispatches_on_the_profile():
    noise = NOISE[:1000]
    heun = sample(gaussian_denoiser, noise, Diffusion(sampler="heun", steps=16))
    res = sample(gaussian_denoiser, noise, Diffusion(sampler="res", steps=16))
    torch.testing.assert_close(
        heun, heun_sampler(gaussian_denoiser, noise, karras_sigmas(16, 0.002, 80.0, 7.0))
    )
    torch.testing.assert_close(
        res, res_sampler(gaussian_denoiser, noise, karras_sigmas(16, 0.002, 80.0, 7.0))
    )
    churned = sample(
        gaussian_denoiser, noise, Diffusion(sampler="heun", steps=4, churn=10.0), torch.Generator()
    )
    expected = heun_sampler(
        gaussian_denoiser, noise, karras_sigmas(4, 0.002, 80.0, 7.0), churn=10.0, generator=torch.Generator()
    )
    torch.testing.assert_close(churned, expected)


@pytest.mark.parametrize("sets", [["diffusion.sampler=res"], ["diffusion.objective=flow"]])
def test_churn_on_a_deterministic_sampler_is_refused_when_the_profile_loads(sets):
    """Before any model is built: one line naming the field, exit 2 (UserInputError), not a failure
    halfway into sampling."""
    from vidforge.errors import UserInputError
    from vidforge.profile import load_profile

    with pytest.raises(
        UserInputError, match=r"churn=1: the (res|unipc) sampler is deterministic; set diffusion.churn=0"
    ):
        load_profile("local_cpu", [*sets, "diffusion.churn=1"])
