"""Which sampling loop `vidforge infer` runs the network in, one per mode: two experts switched by the
step's time (Wan2.2 A14B, one process), several ranks sharing each batch (`infer.plan.InferPlan`), or one
process with step caching; each returns the same `Sampler` and, for the one process, its `StepCache`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from vidforge.infer.image_condition import ImageCondition
from vidforge.infer.plan import (
    InferPlan,
    Sampler,
    check_plan,
    check_sequence_split,
    parallel_sampler,
    profile_slicing,
)
from vidforge.parallel.scalefusion import ScaleFusionSlicing
from vidforge.profile import RunProfile
from vidforge.sampling.experts import sample_latents_experts
from vidforge.sampling.latents import sample_latents
from vidforge.sampling.step_cache import StepCache, rescale_name
from vidforge.weights.experts import Experts


def choose_sampler(
    model: nn.Module,
    prof: RunProfile,
    latent_shape: Sequence[int],
    world: int,
    device: str,
    channels: ImageCondition | None = None,
    first_frame: torch.Tensor | None = None,
    lora: object = None,
    slicing: ScaleFusionSlicing | None = None,
    log: Callable[[str], Any] | None = None,
) -> tuple[Sampler, StepCache | None]:
    """The sampler of `model` for this run, and the step cache that counts its calls (None where calls
    are not counted). The layout rulebook (`sampling_run_problems`) has refused the runs no mode takes;
    a plan of several ranks the model cannot take is refused here, before sampling; `log` is told it."""
    if isinstance(model, Experts):
        return experts_sampler(model, prof, channels), None
    if world > 1:
        return ranks_sampler(model, prof, latent_shape, world, device, lora, slicing, log), None
    return one_process_sampler(model, prof, channels, first_frame)


def experts_sampler(model: Experts, prof: RunProfile, channels: ImageCondition | None) -> Sampler:
    """Wan2.2 A14B: the expert and its guidance switched by the step's t (I2V-A14B's image through
    `channels`)."""
    conditioned = channels.forward if channels is not None else None

    def sampler(text, mask, seeds, shape, negative):
        return sample_latents_experts(model, prof, text, mask, seeds, shape, negative, conditioned)

    return sampler


def ranks_sampler(
    model: nn.Module,
    prof: RunProfile,
    latent_shape: Sequence[int],
    world: int,
    device: str,
    lora: object,
    slicing: ScaleFusionSlicing | None,
    log: Callable[[str], Any] | None,
) -> Sampler:
    """`world` ranks sharing each batch as `InferPlan` says (told to `log`, if given)."""
    plan = InferPlan.choose(
        world, prof.diffusion.guidance, model.config, prof.infer.tp, prof.parallel.cp_impl
    )
    if log is not None:
        log(f"{world} ranks: {plan.describe()}")
    check_plan(plan, prof, lora)
    check_sequence_split(plan, model.config, latent_shape)
    return parallel_sampler(model, prof, plan, device, slicing or profile_slicing(prof))


def one_process_sampler(
    model: nn.Module,
    prof: RunProfile,
    channels: ImageCondition | None,
    first_frame: torch.Tensor | None,
) -> tuple[Sampler, StepCache]:
    """One process: step caching (infer.cache), an image's first frame or condition channels."""
    setting = prof.infer.cache
    cache = StepCache(setting.threshold, rescale_name(setting.rescale, model.config))
    forward = channels.forward(model) if channels is not None else None

    def sampler(text, mask, seeds, shape, negative):
        return sample_latents(
            model, prof, text, mask, seeds, shape, negative,
            cache=cache, first_frame=first_frame, forward=forward,
        )  # fmt: skip

    return sampler, cache
