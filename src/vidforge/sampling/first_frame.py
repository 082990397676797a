"""Sampling from an image through the first latent frame (a model with `model.expand_timesteps`, Wan2.2
TI2V, LTX-2), as diffusers' `WanImageToVideoPipeline(expand_timesteps=True)` and `LTX2ImageToVideoPipeline`
do: the image's latent (the VAE encodes a one-frame video: its causal encoder makes the first latent frame
from the first pixel frame alone, so this is also the first latent frame of any clip starting with that
image) stands in for the first latent frame of every network input, whose tokens get noise level 0 while
the rest get the step's level. The sampler carries the image's latent in its first frame from the start
(`with_first_frame` of the noise) and the denoiser holds it there (`holding_first_frame`), so a guidance
that reads whole samples (LTX-2's rescale, by each sample's standard deviation) sees the pipeline's clean
estimates, the first frame's included; the samplers work elementwise otherwise, so that frame never
reaches the others."""

from __future__ import annotations

from collections.abc import Callable

import torch

from vidforge.tokens import token_grid


def first_frame_network(
    network_fn: Callable[..., torch.Tensor], first_frame: torch.Tensor, patch: tuple[int, int, int]
) -> Callable[..., torch.Tensor]:
    """`network_fn(x, noise_level, text, text_mask, drop_text=...)` over latents (rows, C, T, H, W) with the
    first latent frame replaced by `first_frame` (B, C, 1, H, W) (row i takes image i % B, as the guidance
    rows do) and a per-token noise level: 0 on that frame's tokens, the row's level on the others."""

    def forward(x: torch.Tensor, noise_level: torch.Tensor, text, text_mask, drop_text=None) -> torch.Tensor:
        rows = x.shape[0]
        first = first_frame.to(x.device, x.dtype).repeat(rows // first_frame.shape[0], 1, 1, 1, 1)
        x = torch.cat([first, x[:, :, 1:]], dim=2)
        t, h, w = token_grid(x.shape[2:], patch)
        levels = noise_level[:, None].expand(rows, t * h * w)
        clean = torch.arange(t * h * w, device=x.device) < h * w  # tokens run t-major: frame 0 first
        levels = torch.where(clean[None], torch.zeros((), dtype=levels.dtype, device=x.device), levels)
        return network_fn(x, levels, text, text_mask, drop_text=drop_text)

    return forward


def with_first_frame(latents: torch.Tensor, first_frame: torch.Tensor) -> torch.Tensor:
    """`latents` (B, C, T, H, W) with their first frame replaced by `first_frame` (B or 1, C, 1, H, W)."""
    first = first_frame.to(latents.device, latents.dtype).expand(latents.shape[0], -1, -1, -1, -1)
    return torch.cat([first, latents[:, :, 1:]], dim=2)


def holding_first_frame(denoiser: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """`denoiser(x, sigma)` whose estimate of the first latent frame is that frame of x: a sampler's step
    leaves it where it is (the pipelines step the other frames only)."""

    def denoise(x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        return torch.cat([x[:, :, :1], denoiser(x, sigma)[:, :, 1:]], dim=2)

    return denoise
