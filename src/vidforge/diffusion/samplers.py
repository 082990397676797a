"""Samplers of the EDM objective, listed by name in `vidforge.sampler_registry`: deterministic or
stochastic solvers of its probability-flow ODE

    dx/dsigma = (x - D(x; sigma)) / sigma,

from x ~ N(0, sigma_max^2) down to sigma = 0. They take a denoiser callable D(x, sigma) -> estimate of
the clean sample (sigma a 0-d tensor) and know nothing about models, so they are tested with the
closed-form denoiser of Gaussian data.

- `heun_sampler`: Karras et al. (2022) Algorithm 2. Each step optionally raises sigma by a factor
  (1 + gamma) with fresh noise ("churn"), takes an Euler step to the next sigma, then corrects it with
  the slope evaluated at the predicted point and the next sigma (trapezoidal rule): second order. The
  last step, to sigma = 0, is plain Euler. 2N - 1 denoiser evaluations for N steps.
- `res_sampler`: the RES second-order multistep exponential integrator (Zhang et al. 2023, "Improved
  order analysis and design of exponential integrator for diffusion models"). In lambda = -ln(sigma)
  the ODE is linear in x with the denoiser as forcing; the step integrates the linear part exactly and
  the denoiser's linear interpolation through the last two evaluations with phi functions:
      x' = e^-h x + h (b1 D_i + b2 D_{i-1}),  h = ln(sigma_i / sigma_{i+1}),  r = h_{i-1} / h,
      b1 = phi1(-h) + phi2(-h) / r,  b2 = -phi2(-h) / r,
  phi1(z) = (e^z - 1)/z, phi2(z) = (e^z - 1 - z)/z^2. The first step is first order (no history), the
  last (to sigma = 0) returns the denoiser's estimate. N evaluations for N steps.
"""

from __future__ import annotations

import math

import torch

from vidforge.diffusion.objective import Denoiser


def _as_sigma(value: float, like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(value, dtype=like.dtype, device=like.device)


def heun_sampler(
    denoise: Denoiser,
    noise: torch.Tensor,
    sigmas: torch.Tensor,
    churn: float = 0.0,
    churn_sigma_min: float = 0.0,
    churn_sigma_max: float = float("inf"),
    s_noise: float = 1.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """EDM Algorithm 2. `noise` is standard normal with the sample's shape; `sigmas` decreasing and
    ending in 0 (`karras_sigmas`). `churn` is S_churn (0: deterministic), applied while
    churn_sigma_min <= sigma <= churn_sigma_max, with noise scaled by `s_noise`."""
    levels = [float(s) for s in sigmas]
    _check_sigmas(levels)
    steps = len(levels) - 1
    x = noise * levels[0]
    for i in range(steps):
        sigma, sigma_next = levels[i], levels[i + 1]
        gamma = (
            min(churn / steps, math.sqrt(2) - 1)
            if churn > 0 and churn_sigma_min <= sigma <= churn_sigma_max
            else 0.0
        )
        sigma_hat = sigma * (1 + gamma)
        if gamma > 0:
            fresh = torch.randn(x.shape, generator=generator, dtype=x.dtype, device=x.device)
            x = x + math.sqrt(sigma_hat**2 - sigma**2) * s_noise * fresh
        slope = (x - denoise(x, _as_sigma(sigma_hat, x))) / sigma_hat
        x_next = x + (sigma_next - sigma_hat) * slope
        if sigma_next > 0:
            slope_next = (x_next - denoise(x_next, _as_sigma(sigma_next, x))) / sigma_next
            x_next = x + (sigma_next - sigma_hat) * (slope + slope_next) / 2
        x = x_next
    return x


def _phi1(h: float) -> float:
    """phi1(-h) = (1 - e^-h) / h."""
    return -math.expm1(-h) / h


def _phi2(h: float) -> float:
    """phi2(-h) = (e^-h - 1 + h) / h^2, by its series where the closed form cancels."""
    if h < 1e-4:
        return 0.5 - h / 6 + h * h / 24
    return (math.expm1(-h) + h) / (h * h)


def res_sampler(denoise: Denoiser, noise: torch.Tensor, sigmas: torch.Tensor) -> torch.Tensor:
    """RES second-order multistep (see the module docstring). Same arguments as `heun_sampler`."""
    levels = [float(s) for s in sigmas]
    _check_sigmas(levels)
    x = noise * levels[0]
    previous: torch.Tensor | None = None
    previous_h = 0.0
    for i in range(len(levels) - 1):
        sigma, sigma_next = levels[i], levels[i + 1]
        denoised = denoise(x, _as_sigma(sigma, x))
        if sigma_next == 0:
            return denoised
        h = math.log(sigma / sigma_next)
        if previous is None:
            x = math.exp(-h) * x + h * _phi1(h) * denoised  # exponential Euler (DDIM)
        else:
            r = previous_h / h
            b2 = -_phi2(h) / r
            b1 = _phi1(h) - b2
            x = math.exp(-h) * x + h * (b1 * denoised + b2 * previous)
        previous, previous_h = denoised, h
    return x


def _check_sigmas(levels: list[float]) -> None:
    if len(levels) < 2 or levels[-1] < 0 or any(a <= b for a, b in zip(levels, levels[1:], strict=False)):
        raise ValueError("sigmas must decrease strictly and end at >= 0 (see karras_sigmas)")
