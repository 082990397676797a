"""The profile's `diffusion` section -> its objective and its sampler (the math modules themselves import
no profile)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from vidforge.diffusion.dmd import few_step_sampler
from vidforge.diffusion.edm import EDM
from vidforge.diffusion.flow import RectifiedFlow, flow_sample, flow_sigmas
from vidforge.diffusion.objective import Objective
from vidforge.diffusion.samplers import Denoiser, heun_sampler, res_sampler
from vidforge.diffusion.schedule import karras_sigmas
from vidforge.errors import UserInputError
from vidforge.profile.diffusion import FEW_STEP, Diffusion

OBJECTIVES: dict[str, Callable[[Diffusion], Objective]] = {
    "edm": lambda c: EDM(sigma_data=c.sigma_data, p_mean=c.p_mean, p_std=c.p_std),
    "flow": lambda c: RectifiedFlow(
        c.flow_time_sampling, c.flow_logit_mean, c.flow_logit_std, c.flow_shift, c.flow_prediction
    ),
}


def build_objective(cfg: Diffusion) -> Objective:
    """The objective that training optimises and sampling inverts (`diffusion.objective`)."""
    return OBJECTIVES[cfg.objective](cfg)


def sample(
    denoise: Denoiser, noise: torch.Tensor, cfg: Diffusion, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Run the profile's sampler from standard normal `noise`: heun / res over the Karras schedule (EDM:
    `denoise(x, sigma)`), or unipc / flow-euler over the shifted flow times (flow: `denoise(x, t)`); the
    profile's validator has matched the sampler to the objective. `few-step`: a distilled student over
    `diffusion.few_step_levels`, its re-noising drawn from `generator`."""
    if cfg.sampler == FEW_STEP:

        def draw(like: torch.Tensor) -> torch.Tensor:
            return torch.randn(like.shape, generator=generator, dtype=like.dtype, device=like.device)

        return few_step_sampler(denoise, noise, cfg.few_step_levels, build_objective(cfg), draw)
    if cfg.sampler in ("unipc", "flow-euler"):
        return flow_sample(
            denoise, noise, "unipc" if cfg.sampler == "unipc" else "euler", cfg.steps, cfg.flow_shift
        )
    sigmas = karras_sigmas(cfg.steps, cfg.sigma_min, cfg.sigma_max, cfg.rho)
    if cfg.sampler == "heun":
        return heun_sampler(denoise, noise, sigmas, churn=cfg.churn, generator=generator)
    if cfg.churn > 0:
        raise UserInputError(
            "diffusion.churn: the RES sampler is deterministic; set churn to 0 or use sampler=heun"
        )
    return res_sampler(denoise, noise, sigmas)


def student_levels(cfg: Diffusion, steps: int) -> tuple[float, ...]:
    """A few-step student's default noise levels: the objective's own sampling schedule, `steps` levels
    from where sampling starts. Flow: the times of `steps` sampling steps from 1 (shifted by
    diffusion.flow_shift), the final 0 dropped. EDM: the Karras sigmas of `steps + 1` steps from sigma_max,
    their last two (sigma_min and 0) dropped: a student call at sigma_min would return its input."""
    if cfg.objective == "flow":
        levels = flow_sigmas(steps, cfg.flow_shift)[:-1]
    else:
        levels = karras_sigmas(steps + 1, cfg.sigma_min, cfg.sigma_max, cfg.rho)[:-2]
    return tuple(float(v) for v in levels)
