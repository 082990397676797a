"""CFG-parallel: classifier-free guidance (`vidforge.diffusion.guidance`) with its two branches on two ranks
instead of one doubled batch; each rank runs its branch, the two answers are exchanged with one
all-gather, and both ranks mix them identically, so every rank of the pair carries the same sample
through the sampler."""

from __future__ import annotations

import torch
import torch.distributed as dist

from vidforge.diffusion.guidance import BatchedDenoiser, guided
from vidforge.diffusion.objective import Denoiser
from vidforge.errors import UserInputError


def parallel_classifier_free_guidance(
    batched: BatchedDenoiser, scale: float, group, rescale: float = 0.0
) -> Denoiser:
    """CFG-parallel: like `classifier_free_guidance`, but the conditional branch runs on rank 0 of the
    two-rank process `group` and the unconditional branch on rank 1 (each with the batch x itself, not
    doubled); one all-gather exchanges the answers and both ranks mix them in the same order, so both
    return the same tensor. Every rank of the group must call the returned denoiser with the same x and
    sigma (a sampler seeded alike on both does). scale 1 needs no unconditional branch: use
    `classifier_free_guidance` then."""
    if scale < 0:
        raise ValueError(f"the guidance scale must be >= 0, got {scale}")
    if scale == 1.0:
        raise UserInputError(
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
        return guided(cond_out, uncond_out, scale, rescale)

    return denoise
