"""Classifier-free guidance (Ho & Salimans 2022): D = D_uncond + w (D_cond - D_uncond), with the
conditional and unconditional halves evaluated in one batch, optionally rescaled (`guided`). The unconditional branch is the same
model given its learned null caption (`drop_text`), which training taught it through caption dropout.
CFG-parallel, the two branches on two ranks, is `vidforge.parallel.cfg_parallel`."""

from __future__ import annotations

from collections.abc import Callable

import torch

from vidforge.diffusion.objective import Denoiser

BatchedDenoiser = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""D(x, sigma, uncond) with uncond (B,) bool: True rows are denoised without their caption."""


def classifier_free_guidance(batched: BatchedDenoiser, scale: float, rescale: float = 0.0) -> Denoiser:
    """A plain denoiser D(x, sigma) from a batched one. scale 1 runs the conditional branch alone;
    otherwise x is doubled, [cond; uncond] run in one call, and mixed (`guided`, with `rescale`)."""
    if scale < 0:
        raise ValueError(f"the guidance scale must be >= 0, got {scale}")

    def denoise(x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        if scale == 1.0:
            return batched(x, sigma, torch.zeros(b, dtype=torch.bool, device=x.device))
        uncond = torch.arange(2 * b, device=x.device) >= b
        both = batched(torch.cat([x, x]), sigma, uncond)
        return guided(both[:b], both[b:], scale, rescale)

    return denoise


def guided(cond: torch.Tensor, uncond: torch.Tensor, scale: float, rescale: float = 0.0) -> torch.Tensor:
    """The guided estimate from the two branches' (sampling's, and DMD's real score's). `rescale` > 0:
    mixed by that weight with itself scaled to the conditional estimate's standard deviation over each
    whole sample (Lin et al. 2024; diffusers' rescale_noise_cfg, which LTX-2's pipeline applies to clean
    estimates), so x must hold whole samples, not a rank's share of their tokens."""
    mixed = uncond + scale * (cond - uncond)
    if rescale == 0:
        return mixed
    dims = list(range(1, cond.ndim))
    ratio = cond.std(dim=dims, keepdim=True) / mixed.std(dim=dims, keepdim=True)
    return rescale * (mixed * ratio) + (1 - rescale) * mixed
