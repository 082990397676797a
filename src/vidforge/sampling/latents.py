"""From caption embeddings to latents, in one process or with the tokens split over context-parallel ranks: the objective's denoiser of a DiT under classifier-free guidance, driven by
the profile's sampler. Shared by `vidforge infer` and the training loop's validation samples."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import nn

from vidforge.diffusion import build_objective, classifier_free_guidance, sample
from vidforge.diffusion.from_profile import at_tokens
from vidforge.diffusion.guidance import BatchedDenoiser
from vidforge.errors import UserInputError
from vidforge.parallel.cfg_parallel import parallel_classifier_free_guidance
from vidforge.parallel.context_parallel import (
    ContextParallelAttend,
    CpGroup,
    cp_process_group,
    gather_row,
    shard_of,
)
from vidforge.profile import RunProfile
from vidforge.sampling.first_frame import first_frame_network, holding_first_frame, with_first_frame
from vidforge.sampling.step_cache import StepCache, installed
from vidforge.tokens import patchify, token_grid, unpatchify


def initial_noise(seeds: Sequence[int], latent_shape: Sequence[int]) -> torch.Tensor:
    """Standard normal noise, one generator per sample: a prompt's video depends on its seed only, not
    on which other prompts share its batch."""
    return torch.stack(
        [torch.randn(tuple(latent_shape), generator=torch.Generator().manual_seed(s)) for s in seeds]
    )


@torch.no_grad()
def sample_latents(
    model: nn.Module,
    profile: RunProfile,
    text: torch.Tensor,
    text_mask: torch.Tensor,
    seeds: Sequence[int],
    latent_shape: Sequence[int],
    negative: tuple[torch.Tensor, torch.Tensor] | None = None,
    *,
    cfg_group=None,
    forward: Callable[..., torch.Tensor] | None = None,
    cache: StepCache | None = None,
    first_frame: torch.Tensor | None = None,
) -> torch.Tensor:
    """Latents (B, C, T, H, W) for captions `text` (B, L, D) with `text_mask` (B, L). The unconditional
    guidance branch uses the learned null caption, or `negative` (1, L, D) embeddings and mask if given.
    Conditional and unconditional rows run in one batch, or, with `cfg_group` (a two-rank process
    group), on the two ranks of that group (CFG-parallel; both ranks return the same latents).
    `forward(x, noise_level, text, text_mask, drop_text=...)` replaces `model(...)` as the network, e.g.
    a sequence-parallel forward over the same model (`vidforge.parallel.scalefusion`). `cache`: step
    caching over `model`'s block stack (one process; it counts the calls it saw and skipped).
    `first_frame`: image latents (B, C, 1, H, W) the videos start from (`vidforge.sampling.first_frame`)."""
    param = next(model.parameters())
    network = model if forward is None else forward
    if first_frame is not None:
        network = first_frame_network(network, first_frame.to(param.device), tuple(model.config.patch))
    text, text_mask = text.to(param.device), text_mask.to(param.device)
    denoiser = guided_denoiser(network, profile, text, text_mask, negative, cfg_group, param.dtype)
    noise = initial_noise(seeds, latent_shape).to(param.device)
    if first_frame is not None:
        noise, denoiser = with_first_frame(noise, first_frame), holding_first_frame(denoiser)
    generator = torch.Generator(device=param.device).manual_seed(int(seeds[0]))  # churn noise, if any
    tokens = math.prod(token_grid(tuple(latent_shape)[1:], tuple(model.config.patch)))
    with installed(model, cache):
        latents = sample(denoiser, noise, at_tokens(profile.diffusion, tokens), generator=generator)
    return latents if first_frame is None else with_first_frame(latents, first_frame)


def guided_denoiser(
    network_fn: Callable[..., torch.Tensor],
    profile: RunProfile,
    text: torch.Tensor,
    text_mask: torch.Tensor,
    negative: tuple[torch.Tensor, torch.Tensor] | None = None,
    cfg_group=None,
    dtype: torch.dtype = torch.float32,
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The sampler's denoiser D(x; sigma): `batched_denoiser` under classifier-free guidance (in one
    batch, or over `cfg_group`'s two ranks)."""
    batched = batched_denoiser(network_fn, profile, text, text_mask, negative, dtype)
    d = profile.diffusion
    if cfg_group is not None:
        return parallel_classifier_free_guidance(batched, d.guidance, cfg_group, d.guidance_rescale)
    return classifier_free_guidance(batched, d.guidance, d.guidance_rescale)


def batched_denoiser(
    network_fn: Callable[..., torch.Tensor],
    profile: RunProfile,
    text: torch.Tensor,
    text_mask: torch.Tensor,
    negative: tuple[torch.Tensor, torch.Tensor] | None = None,
    dtype: torch.dtype = torch.float32,
) -> BatchedDenoiser:
    """D(x, sigma, uncond) for captions `text` (B, L, D): the objective's preconditioning around
    `network_fn(x, noise_level, text, text_mask, drop_text=...)` (the model, or a parallel forward of it)
    evaluated in `dtype`. Row i of x is sample i % B; rows marked `uncond` are denoised with the negative
    caption if there is one, else the model's null caption. x may be whole latents or a rank's tokens:
    everything here is per sample or elementwise."""
    device = text.device
    objective = build_objective(profile.diffusion)
    b = text.shape[0]
    text, text_mask = text.to(device, dtype), text_mask.to(device)
    if negative is not None:
        neg_text = negative[0].to(device, dtype).expand(b, -1, -1)
        neg_mask = negative[1].to(device).expand(b, -1)
        length = max(text.shape[1], neg_text.shape[1])
        text, text_mask = _pad(text, length), _pad_mask(text_mask, length)
        neg_text, neg_mask = _pad(neg_text, length), _pad_mask(neg_mask, length)

    def batched(x: torch.Tensor, sigma: torch.Tensor, uncond: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        texts, masks = text.repeat(rows // b, 1, 1), text_mask.repeat(rows // b, 1)
        if negative is not None:
            negs, neg_masks = neg_text.repeat(rows // b, 1, 1), neg_mask.repeat(rows // b, 1)
            texts = torch.where(uncond[:, None, None], negs, texts)
            masks = torch.where(uncond[:, None], neg_masks, masks)
            drop = torch.zeros(rows, dtype=torch.bool, device=device)
        else:
            drop = uncond
        per_sample = sigma.reshape(()).expand(rows)

        def network(x_in: torch.Tensor, c_noise: torch.Tensor) -> torch.Tensor:
            return network_fn(x_in.to(dtype), c_noise.to(dtype), texts, masks, drop_text=drop).float()

        return objective.denoise(network, x, per_sample)

    return batched


def _pad(text: torch.Tensor, length: int) -> torch.Tensor:
    return torch.nn.functional.pad(text, (0, 0, 0, length - text.shape[1]))


def _pad_mask(mask: torch.Tensor, length: int) -> torch.Tensor:
    return torch.nn.functional.pad(mask, (0, length - mask.shape[1]), value=False)


@torch.no_grad()
def sample_latents_cp(
    model: nn.Module,
    profile,
    text: torch.Tensor,
    text_mask: torch.Tensor,
    seeds: Sequence[int],
    latent_shape: Sequence[int],
    cp_mesh: CpGroup,
    negative: tuple[torch.Tensor, torch.Tensor] | None = None,
    *,
    cfg_group: CpGroup | None = None,
) -> torch.Tensor:
    """`sample_latents` with the latent token sequence split over the cp ranks
    (NeMo's context-parallel denoising): every rank draws the same initial noise, keeps its tokens, runs
    the sampler on them (EDM preconditioning, guidance and the Heun/RES updates are elementwise per
    token, so each rank steps its own shard) with the model evaluated context-parallel, and the
    latents are gathered at the end. Returns (B, C, T, H, W) on every rank. `model` must have had
    `apply_cp` installed on the same group. Deterministic samplers give the single-process latents;
    with diffusion.churn > 0 each rank draws its churn noise from its own generator (seed, rank), a
    valid but different noise stream. With `cfg_group` (two ranks holding the same cp shard, e.g. a
    (cfg 2, cp n) mesh's "cfg" dimension) the conditional and unconditional branches run on its two
    ranks, as in `sample_latents(cfg_group=...)`."""
    if not any(isinstance(m, ContextParallelAttend) for m in model.modules()):
        raise ValueError(
            "sample_latents_cp needs a context-parallel model: call apply_cp(model, cp_mesh, impl)"
        )
    if profile.diffusion.guidance_rescale:
        raise UserInputError(
            "diffusion.guidance_rescale: it scales by each whole sample's standard deviation, and context-"
            "parallel sampling holds a share of each sample's tokens; set it to 0 or sample without cp"
        )
    group = cp_process_group(cp_mesh)
    config = model.config
    param = next(model.parameters())
    device = param.device
    # st-spatial's ranks hold (h, w) position columns; every other method contiguous chunks
    shard = shard_of(token_grid(tuple(latent_shape)[1:], config.patch), group, profile.parallel.token_slicing)

    def forward(x, noise_level, texts, masks, drop_text):
        return model(x, noise_level, texts, masks, drop_text=drop_text, shard=shard)

    cfg_pg = cp_process_group(cfg_group) if cfg_group is not None else None
    denoiser = guided_denoiser(forward, profile, text.to(device), text_mask, negative, cfg_pg, param.dtype)
    noise = shard.split(patchify(initial_noise(seeds, latent_shape), config.patch).to(device))
    generator = torch.Generator(device=device).manual_seed(int(seeds[0]) + 1_000_003 * shard.rank)
    per_sample = math.prod(token_grid(tuple(latent_shape)[1:], config.patch))
    local = sample(denoiser, noise, at_tokens(profile.diffusion, per_sample), generator=generator)
    tokens = gather_row(local, shard, group)
    return unpatchify(tokens, shard.grid, config.patch, config.in_channels)
