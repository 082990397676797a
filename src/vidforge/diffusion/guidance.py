"""Classifier-free guidance (Ho & Salimans 2022): D = D_uncond + w (D_cond - D_uncond), with the
conditional and unconditional halves evaluated in one batch. The unconditional branch is the same
model given its learned null caption (`drop_text`), which training taught it through caption dropout."""

from __future__ import annotations

from collections.abc import Callable

import torch

from vidforge.diffusion.edm import EDM
from vidforge.diffusion.samplers import Denoiser

BatchedDenoiser = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""D(x, sigma, uncond) with uncond (B,) bool: True rows are denoised without their caption."""


def classifier_free_guidance(batched: BatchedDenoiser, scale: float) -> Denoiser:
    """A plain denoiser D(x, sigma) from a batched one. scale 1 runs the conditional branch alone;
    otherwise x is doubled, [cond; uncond] run in one call, and mixed."""
    if scale < 0:
        raise ValueError(f"diffusion.guidance must be >= 0, got {scale}")

    def denoise(x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        if scale == 1.0:
            return batched(x, sigma, torch.zeros(b, dtype=torch.bool, device=x.device))
        uncond = torch.arange(2 * b, device=x.device) >= b
        both = batched(torch.cat([x, x]), sigma, uncond)
        cond_out, uncond_out = both[:b], both[b:]
        return uncond_out + scale * (cond_out - uncond_out)

    return denoise


def model_denoiser(
    model: Callable[..., torch.Tensor],
    edm: EDM,
    text: torch.Tensor,
    text_mask: torch.Tensor | None = None,
    guidance: float = 1.0,
) -> Denoiser:
    """The guided EDM denoiser of a model with vidforge's forward signature
    `model(x, noise_level, text, text_mask, drop_text=...)`, for a plain batch of latents
    (B, C, T, H, W) captioned by text (B, L, text_dim). Runs the model in its parameter dtype."""
    dtype = next(model.parameters()).dtype if hasattr(model, "parameters") else text.dtype

    def batched(x: torch.Tensor, sigma: torch.Tensor, uncond: torch.Tensor) -> torch.Tensor:
        repeats = x.shape[0] // text.shape[0]
        texts = text.repeat(repeats, 1, 1)
        masks = text_mask.repeat(repeats, 1) if text_mask is not None else None
        per_sample = sigma.reshape(()).expand(x.shape[0])

        def network(x_in: torch.Tensor, c_noise: torch.Tensor) -> torch.Tensor:
            return model(x_in.to(dtype), c_noise.to(dtype), texts.to(dtype), masks, drop_text=uncond)

        return edm.denoise(network, x, per_sample)

    return classifier_free_guidance(batched, guidance)
