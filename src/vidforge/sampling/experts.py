"""Sampling a two-expert model (`vidforge.weights.experts.Experts`, Wan2.2 A14B) as diffusers' WanPipeline
does: at each step the expert of the step's time runs (the high-noise one while the timestep is >=
model.boundary_ratio x 1000), under its own guidance scale (`diffusion.guidance`, and
`diffusion.guidance_2` for the low-noise expert, `guidance` when unset). An image-to-video pair (Wan2.2
I2V-A14B) reads its image's condition latents through `forward`, at every step of either expert, as
WanImageToVideoPipeline with `transformer_2` does."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from vidforge.diffusion import classifier_free_guidance, sample
from vidforge.profile import RunProfile
from vidforge.sampling.latents import batched_denoiser, initial_noise
from vidforge.weights.experts import Experts


@torch.no_grad()
def sample_latents_experts(
    model: Experts,
    profile: RunProfile,
    text: torch.Tensor,
    text_mask: torch.Tensor,
    seeds: Sequence[int],
    latent_shape: Sequence[int],
    negative: tuple[torch.Tensor, torch.Tensor] | None = None,
    forward: Callable[[nn.Module], Callable[..., torch.Tensor]] | None = None,
) -> torch.Tensor:
    """`vidforge.sampling.latents.sample_latents` (one process) with the expert, and its guidance scale,
    switched by the time of each step. `forward(expert)`: the forward that runs an expert (its image's
    conditioning, `vidforge.infer.image_condition.ImageCondition.forward`); None runs it as it is."""
    param = next(model.parameters())
    text, text_mask = text.to(param.device), text_mask.to(param.device)
    d = profile.diffusion
    scales = (d.guidance, d.guidance if d.guidance_2 is None else d.guidance_2)
    high, low = (
        classifier_free_guidance(
            batched_denoiser(net, profile, text, text_mask, negative, param.dtype), s, d.guidance_rescale
        )
        for net, s in zip(
            (model.high, model.low) if forward is None else (forward(model.high), forward(model.low)),
            scales,
            strict=True,
        )
    )

    def denoise(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return (high if model.expert(float(t)) is model.high else low)(x, t)

    noise = initial_noise(seeds, latent_shape).to(param.device)
    generator = torch.Generator(device=param.device).manual_seed(int(seeds[0]))
    return sample(denoise, noise, d, generator=generator)
