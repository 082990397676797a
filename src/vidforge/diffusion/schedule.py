"""Sampling noise levels: the Karras et al. (2022) schedule, eq. (5):

    sigma_i = (sigma_max^(1/rho) + i/(N-1) (sigma_min^(1/rho) - sigma_max^(1/rho)))^rho,  i = 0..N-1,

followed by sigma_N = 0. rho = 7 spends more steps at small sigma, where detail forms."""

from __future__ import annotations

import torch


def karras_sigmas(
    steps: int,
    sigma_min: float = 0.002,
    sigma_max: float = 80.0,
    rho: float = 7.0,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """(steps + 1,) decreasing noise levels from sigma_max to sigma_min, then 0."""
    if steps < 1:
        raise ValueError(f"the Karras schedule needs steps >= 1, got {steps}")
    if not 0 < sigma_min < sigma_max:
        raise ValueError(
            f"the Karras schedule needs 0 < sigma_min < sigma_max, got {sigma_min} and {sigma_max}"
        )
    if steps == 1:
        return torch.tensor([sigma_max, 0.0], dtype=dtype)
    ramp = torch.linspace(0, 1, steps, dtype=torch.float64)
    lo, hi = sigma_min ** (1 / rho), sigma_max ** (1 / rho)
    sigmas = (hi + ramp * (lo - hi)) ** rho
    return torch.cat([sigmas, sigmas.new_zeros(1)]).to(dtype)
