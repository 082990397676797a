"""The profile's `diffusion` section -> its objective, its schedule and its sampler (the math modules
themselves import no profile). Which names exist, which sampler goes with which objective and which of
the functions here build an objective and its schedule is `vidforge.sampler_registry`'s one table; the
profile's validator has checked the pair."""

from __future__ import annotations

import torch

from vidforge import sampler_registry
from vidforge.diffusion.edm import EDM
from vidforge.diffusion.flow import RectifiedFlow, token_shift
from vidforge.diffusion.flow_samplers import flow_sigmas
from vidforge.diffusion.objective import Denoiser, Objective
from vidforge.diffusion.schedule import karras_sigmas
from vidforge.profile.diffusion import Diffusion


def edm_objective(d: Diffusion) -> Objective:
    return EDM(sigma_data=d.sigma_data, p_mean=d.p_mean, p_std=d.p_std)


def edm_levels(d: Diffusion) -> torch.Tensor:
    return karras_sigmas(d.steps, d.sigma_min, d.sigma_max, d.rho)


def flow_objective(d: Diffusion) -> Objective:
    return RectifiedFlow(
        d.flow_time_sampling,
        d.flow_logit_mean,
        d.flow_logit_std,
        d.flow_shift,
        d.flow_prediction,
        shift_tokens=d.flow_shift_tokens,
    )


def flow_levels(d: Diffusion) -> torch.Tensor:
    return flow_sigmas(d.steps, d.flow_shift, end=d.flow_schedule_end, terminal=d.flow_shift_terminal)


def at_tokens(diffusion: Diffusion, tokens: int) -> Diffusion:
    """`diffusion` for samples of `tokens` video tokens: flow_shift the one `flow_shift_tokens` gives
    (itself without that rule), so that the sampling schedule follows the size as training's times do."""
    if diffusion.objective != "flow" or diffusion.flow_shift_tokens is None:
        return diffusion
    return diffusion.model_copy(update={"flow_shift": token_shift(diffusion.flow_shift_tokens, tokens)})


def build_objective(diffusion: Diffusion) -> Objective:
    """The objective that training optimises and sampling inverts (`diffusion.objective`)."""
    return sampler_registry.objective(diffusion.objective).load_build()(diffusion)


def sample(
    denoise: Denoiser,
    noise: torch.Tensor,
    diffusion: Diffusion,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Run the profile's sampler (`diffusion.sampler`, the registry's entry) from standard normal `noise`
    over its objective's schedule; `denoise(x, level)` is the clean estimate at the objective's level
    (EDM: sigma, flow: t). `generator` draws a stochastic sampler's churn noise, and a distilled
    student's re-noising (its sampler steps over `diffusion.few_step_levels` instead)."""
    entry = sampler_registry.sampler(diffusion.sampler)
    if entry.student:

        def draw(like: torch.Tensor) -> torch.Tensor:
            return torch.randn(like.shape, generator=generator, dtype=like.dtype, device=like.device)

        objective = build_objective(diffusion)
        return entry.load()(
            denoise, noise, diffusion.few_step_levels, objective, draw, diffusion.few_step_noise
        )
    levels = sampler_registry.objective(diffusion.objective).load_levels()(diffusion)
    options = {"churn": diffusion.churn, "generator": generator} if entry.stochastic else {}
    return entry.load()(denoise, noise, levels, **options)


def student_levels(diffusion: Diffusion, steps: int, tokens: int | None = None) -> tuple[float, ...]:
    """A few-step student's default noise levels: the objective's own sampling schedule, `steps` levels
    from where sampling starts. Flow: the times of `steps` sampling steps from 1 (shifted by
    diffusion.flow_shift, or by the shift diffusion.flow_shift_tokens gives samples of `tokens` video
    tokens, as the teacher's sampler does: `at_tokens`), the final 0 dropped. EDM: the Karras sigmas of
    `steps + 1` steps from sigma_max, their last two (sigma_min and 0) dropped: a student call at
    sigma_min would return its input."""
    if diffusion.objective == "flow":
        if diffusion.flow_shift_tokens is not None:
            if tokens is None:
                raise ValueError(
                    "student_levels: a token-count shift (flow_shift_tokens) needs the samples' tokens"
                )
            diffusion = at_tokens(diffusion, tokens)
        levels = flow_sigmas(
            steps,
            diffusion.flow_shift,
            end=diffusion.flow_schedule_end,
            terminal=diffusion.flow_shift_terminal,
        )[:-1]
    else:
        levels = karras_sigmas(steps + 1, diffusion.sigma_min, diffusion.sigma_max, diffusion.rho)[:-2]
    return tuple(float(v) for v in levels)
