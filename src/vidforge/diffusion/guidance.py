"""Classifier-free guidance (Ho & Salimans 2022): D = D_uncond + w (D_cond - D_uncond), with the
conditional and unconditional halves evaluated in one batch. The unconditional branch is the same
model given its learned null caption (`drop_text`), which training taught it through caption dropout.

CFG-parallel (`parallel_classifier_free_guidance`): the two branches on two ranks instead of one
doubled batch; each rank runs its branch, the two answers are exchanged with one all-gather, and both
ranks mix them identically, so every rank of the pair carries the same sample through the sampler."""

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


def parallel_classifier_free_guidance(batched: BatchedDenoiser, scale: float, group) -> Denoiser:
    """CFG-parallel: like `classifier_free_guidance`, but the conditional branch runs on rank 0 of the
    two-rank process `group` and the unconditional branch on rank 1 (each with the batch x itself, not
    doubled); one all-gather exchanges the answers and both ranks mix them in the same order, so both
    return the same tensor. Every rank of the group must call the returned denoiser with the same x and
    sigma (a sampler seeded alike on both does). scale 1 needs no unconditional branch: use
    `classifier_free_guidance` then."""
    import torch.distributed as dist

    if scale < 0:
        raise ValueError(f"diffusion.guidance must be >= 0, got {scale}")
    if scale == 1.0:
        raise ValueError(
            "CFG-parallel needs an unconditional branch: diffusion.guidance is 1; run on one rank per sample"
        )
    size = dist.get_world_size(group)
    if size != 2:
        raise ValueError(f"CFG-parallel runs the two guidance branches on 2 ranks, got a group of {size}")
    branch = dist.get_rank(group)  # 0: conditional, 1: unconditional
    # torch 2.14 renamed all_gather_into_tensor to all_gather_single; the GPU machines run older torch.
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

    def denoise(x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        mine = batched(x, sigma, torch.full((b,), bool(branch), dtype=torch.bool, device=x.device))
        both = torch.empty((2 * b, *mine.shape[1:]), dtype=mine.dtype, device=mine.device)
        gather(both, mine.detach().contiguous(), group=group)  # inference only: no autograd through it
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
