"""`diffusion`: the EDM formulation (Karras et al. 2022) and the sampler used at inference."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from vidforge.profile.base import Section


class Diffusion(Section):
    """EDM preconditioning, training noise distribution and sampling. Defaults are the paper's."""

    sigma_data: float = Field(0.5, gt=0)
    """Standard deviation of the (normalised) latents; sets c_skip, c_out and c_in."""
    p_mean: float = -1.2
    """Mean of log(sigma) during training (log-normal noise distribution)."""
    p_std: float = Field(1.2, gt=0)
    """Standard deviation of log(sigma) during training."""
    sigma_min: float = Field(0.002, gt=0)
    """Smallest sigma of the sampling schedule."""
    sigma_max: float = Field(80.0, gt=0)
    """Largest sigma of the sampling schedule (where sampling starts from pure noise)."""
    rho: float = Field(7.0, gt=0)
    """Karras schedule exponent: larger spends more steps at small sigma."""
    sampler: Literal["heun", "res"] = "heun"
    """`heun`: EDM's 2nd-order Heun sampler. `res`: RES 2nd-order multistep exponential integrator."""
    steps: int = Field(32, ge=1)
    """Sampling steps (sigma levels); Heun evaluates the model about twice per step."""
    churn: float = Field(0.0, ge=0)
    """EDM S_churn: stochasticity added per step (0 is deterministic)."""
    guidance: float = Field(5.0, ge=0)
    """Classifier-free guidance scale; 1 disables the unconditional branch."""
    caption_dropout: float = Field(0.1, ge=0, le=1)
    """Probability that training replaces a caption by the learned null embedding (makes CFG possible)."""

    @model_validator(mode="after")
    def _check(self) -> Diffusion:
        if self.sigma_min >= self.sigma_max:
            raise ValueError(
                f"sigma_min: must be below diffusion.sigma_max={self.sigma_max}, got {self.sigma_min}"
            )
        return self
