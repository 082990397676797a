"""The profile's `diffusion` section -> its objective (the math modules themselves import no profile)."""

from __future__ import annotations

from vidforge.diffusion.edm import EDM
from vidforge.diffusion.objective import Objective
from vidforge.profile.diffusion import Diffusion


def build_objective(cfg: Diffusion) -> Objective:
    """The objective that training optimises and sampling inverts."""
    return EDM(sigma_data=cfg.sigma_data, p_mean=cfg.p_mean, p_std=cfg.p_std)
