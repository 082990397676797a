"""EDM preconditioning identities (Karras et al. 2022, Table 1 and Appendix B.6) and the training noise."""

import math

import pytest
import torch

from vidforge.diffusion import EDM, build_objective, karras_sigmas
from vidforge.profile import Diffusion

SIGMAS = torch.logspace(-3, 2, 41, dtype=torch.float64)


@pytest.mark.parametrize("sigma_data", [0.5, 1.0, 0.2])
def test_preconditioning_matches_table_1(sigma_data):
    edm = EDM(sigma_data=sigma_data)
    s, sd = SIGMAS, sigma_data
    torch.testing.assert_close(edm.c_skip(s), sd**2 / (s**2 + sd**2))
    torch.testing.assert_close(edm.c_out(s), s * sd / torch.sqrt(s**2 + sd**2))
    torch.testing.assert_close(edm.c_in(s), 1 / torch.sqrt(s**2 + sd**2))
    torch.testing.assert_close(edm.c_noise(s), torch.log(s) / 4)
    torch.testing.assert_close(edm.loss_weight(s), (s**2 + sd**2) / (s * sd) ** 2)


@pytest.mark.parametrize("sigma_data", [0.5, 1.3])
def test_design_identities(sigma_data):
    """The choices that make training well-conditioned: lambda c_out^2 = 1 (effective weight 1), and
    c_skip, c_out minimise the target's variance: c_out^2 = (1 - c_skip)^2 sd^2 + c_skip^2 sigma^2."""
    edm = EDM(sigma_data=sigma_data)
    s, sd = SIGMAS, sigma_data
    torch.testing.assert_close(edm.loss_weight(s) * edm.c_out(s) ** 2, torch.ones_like(s))
    torch.testing.assert_close(
        edm.c_out(s) ** 2, (1 - edm.c_skip(s)) ** 2 * sd**2 + edm.c_skip(s) ** 2 * s**2
    )
    # Limits: no noise -> D is the identity; huge noise -> D ignores x.
    assert edm.c_skip(torch.tensor(1e-8)) == pytest.approx(1.0) and edm.c_out(torch.tensor(1e-8)) < 1e-7
    assert edm.c_skip(torch.tensor(1e6)) < 1e-10


def test_network_input_and_target_have_unit_variance():
    """Sampled check of what the formulas are for: for data of std sigma_data, c_in (x + sigma n) and
    the network's target F* = (x - c_skip (x + sigma n)) / c_out both have unit variance."""
    edm = EDM(sigma_data=0.5)
    g = torch.Generator().manual_seed(0)
    clean = 0.5 * torch.randn(200_000, generator=g, dtype=torch.float64)
    noise = torch.randn(200_000, generator=g, dtype=torch.float64)
    for sigma in (0.01, 0.3, 2.0, 50.0):
        s = torch.tensor(sigma, dtype=torch.float64)
        noisy = clean + s * noise
        target = (clean - edm.c_skip(s) * noisy) / edm.c_out(s)
        assert (edm.c_in(s) * noisy).std().item() == pytest.approx(1.0, rel=0.01)
        assert target.std().item() == pytest.approx(1.0, rel=0.01)


def test_denoise_is_skip_plus_scaled_network_output():
    edm = EDM(sigma_data=0.5)
    x = torch.randn(3, 2, 4, dtype=torch.float64)
    sigma = torch.tensor([0.1, 1.0, 10.0], dtype=torch.float64)
    seen = {}

    def network(x_in, c_noise):
        seen["x_in"], seen["c_noise"] = x_in, c_noise
        return torch.full_like(x_in, 2.0)

    out = edm.denoise(network, x, sigma)
    sb = sigma[:, None, None]
    torch.testing.assert_close(seen["x_in"], x / torch.sqrt(sb**2 + 0.25))
    torch.testing.assert_close(seen["c_noise"], torch.log(sigma) / 4)
    torch.testing.assert_close(out, edm.c_skip(sb) * x + 2.0 * edm.c_out(sb))


def test_raw_target_gives_the_weighted_edm_loss_and_the_ideal_network_zero():
    """(F - target)^2 equals lambda(sigma) (D - y)^2 for any raw output F (lambda c_out^2 = 1), the target
    equals (y - c_skip x) / c_out, and an untrained (zero) network has loss about 1."""
    edm = EDM(sigma_data=0.5)
    g = torch.Generator().manual_seed(1)
    clean = 0.5 * torch.randn(4096, 8, generator=g, dtype=torch.float64)
    noise = torch.randn(4096, 8, generator=g, dtype=torch.float64)
    sigma = edm.sample_levels(4096, generator=g).double()
    sb = edm.expand(sigma, clean)
    noisy = edm.corrupt(clean, noise, sb)
    target = edm.target(clean, noise, sb)
    torch.testing.assert_close(target, (clean - edm.c_skip(sb) * noisy) / edm.c_out(sb))
    raw = torch.randn(4096, 8, generator=g, dtype=torch.float64)
    weighted = edm.loss_weight(sb) * (edm.denoised(noisy, raw, sb) - clean) ** 2
    torch.testing.assert_close((raw - target) ** 2, weighted)
    assert (edm.denoised(noisy, target, sb) - clean).abs().max().item() < 1e-12
    assert (target**2).mean().item() == pytest.approx(1.0, rel=0.03)


def test_training_sigma_is_lognormal():
    edm = EDM(p_mean=-1.2, p_std=1.2)
    log_sigma = edm.sample_levels(200_000, generator=torch.Generator().manual_seed(2)).double().log()
    assert log_sigma.mean().item() == pytest.approx(-1.2, abs=0.01)
    assert log_sigma.std().item() == pytest.approx(1.2, rel=0.01)


def test_from_profile_and_validation():
    edm = build_objective(Diffusion(sigma_data=0.7, p_mean=-0.5, p_std=1.0))
    assert isinstance(edm, EDM)
    assert (edm.sigma_data, edm.p_mean, edm.p_std) == (0.7, -0.5, 1.0)
    with pytest.raises(ValueError, match="sigma_data"):
        EDM(sigma_data=0)


def test_karras_schedule():
    sigmas = karras_sigmas(10, 0.002, 80.0, 7.0)
    assert sigmas.shape == (11,) and sigmas[-1] == 0
    assert sigmas[0].item() == pytest.approx(80.0) and sigmas[-2].item() == pytest.approx(0.002)
    assert bool((sigmas[:-1] > sigmas[1:]).all())
    # Equally spaced in sigma^(1/rho).
    spaced = sigmas[:-1] ** (1 / 7)
    torch.testing.assert_close(spaced.diff(), torch.full((9,), spaced.diff()[0].item(), dtype=torch.float64))
    assert karras_sigmas(1, 0.002, 80.0).tolist() == [80.0, 0.0]
    with pytest.raises(ValueError, match="sigma_min"):
        karras_sigmas(4, 1.0, 0.5)
    assert math.isclose(float(karras_sigmas(3, 0.1, 10.0, rho=1.0)[1]), 5.05)
