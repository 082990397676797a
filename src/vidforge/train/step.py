"""One micro-batch's EDM loss, for packed rows and for plain (bucketed) batches alike.

Noise levels, noise and caption dropout are drawn from torch's global generator, whose state the
checkpoint saves, so a resumed run draws exactly what an uninterrupted one would have."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from vidforge.data.packing import BucketBatch, PackedBatch
from vidforge.diffusion import EDM
from vidforge.errors import UserInputError
from vidforge.models.patchify import patchify, token_grid


@dataclass
class MicroLoss:
    loss: torch.Tensor  # scalar, mean over every latent element of the micro-batch
    sigma: torch.Tensor  # (N,) noise level of each sample
    per_sample: torch.Tensor  # (N,) mean loss of each sample (detached)
    tokens: int  # model tokens processed


def micro_batch_loss(
    model: nn.Module,
    edm: EDM,
    batch: PackedBatch | BucketBatch,
    caption_dropout: float,
    device: torch.device,
    compute_dtype: torch.dtype | None = None,
    cp_group: dist.ProcessGroup | None = None,
) -> MicroLoss:
    """Noise the clean latents, denoise with the preconditioned model, weight by lambda(sigma).

    With `cp_group` (context parallel, `apply_cp` installed on the model) this rank denoises only its
    share of the token row and `loss` is its share of the micro-batch mean (the shares sum over the cp
    group to the single-process loss); every rank draws the same noise, in the same shape as one
    process would, so the layouts agree sample for sample."""
    if cp_group is not None:
        return _context_parallel_loss(model, edm, batch, caption_dropout, device, compute_dtype, cp_group)
    text = batch.text_emb.to(device)
    text_mask = batch.text_mask.to(device)
    n = text.shape[0]
    sigma = edm.sample_sigma(n).to(device)  # CPU generator, see the module docstring
    drop_text = (torch.rand(n) < caption_dropout).to(device)
    autocast = torch.autocast(device.type, dtype=compute_dtype) if compute_dtype else nullcontext()

    if isinstance(batch, PackedBatch):
        clean = batch.tokens.to(device)
        layout = batch.layout
        sigma_b = layout.per_token(sigma)[..., None]

        def network(x_in: torch.Tensor, c_noise: torch.Tensor) -> torch.Tensor:
            with autocast:
                return model(x_in, c_noise, text, text_mask, layout=layout, drop_text=drop_text)

        tokens = layout.total
    else:
        clean = batch.latents.to(device)
        layout = None
        sigma_b = edm.expand(sigma, clean)

        def network(x_in: torch.Tensor, c_noise: torch.Tensor) -> torch.Tensor:
            with autocast:
                return model(x_in, c_noise, text, text_mask, drop_text=drop_text)

        cfg = model.config if hasattr(model, "config") else None
        pt, ph, pw = cfg.patch if cfg is not None else (1, 1, 1)
        b, _, t, h, w = clean.shape
        tokens = b * (t // pt) * (h // ph) * (w // pw)

    # Drawn on the CPU generator whatever the device: the stream is the same on CPU and GPU, and the
    # checkpoint's RNG state covers it.
    _check_channels(model, clean, layout is not None)
    noise = torch.randn(clean.shape, dtype=clean.dtype).to(device)
    denoised = edm.denoise(network, clean + sigma_b * noise, sigma, sigma_b)
    elementwise = edm.loss(denoised.float(), clean.float(), sigma_b.float())
    if layout is not None:
        per_token = elementwise.mean(dim=-1)[0]  # (S,)
        index = layout.sample_index(device)
        per_sample = torch.zeros(n, device=device).index_add_(0, index, per_token.detach())
        per_sample = per_sample / torch.tensor(layout.seqlens, device=device, dtype=per_sample.dtype)
    else:
        per_sample = elementwise.detach().flatten(1).mean(dim=1)
    return MicroLoss(elementwise.mean(), sigma.detach(), per_sample, tokens)


def _context_parallel_loss(
    model: nn.Module,
    edm: EDM,
    batch: PackedBatch | BucketBatch,
    caption_dropout: float,
    device: torch.device,
    compute_dtype: torch.dtype | None,
    cp_group: dist.ProcessGroup,
) -> MicroLoss:
    from vidforge.parallel.context_parallel import per_token, shard_loss, shard_of

    text = batch.text_emb.to(device)
    text_mask = batch.text_mask.to(device)
    n = text.shape[0]
    sigma = edm.sample_sigma(n).to(device)  # the same draws, in the same order, as micro_batch_loss
    drop_text = (torch.rand(n) < caption_dropout).to(device)
    autocast = torch.autocast(device.type, dtype=compute_dtype) if compute_dtype else nullcontext()
    patch = model.config.patch
    if isinstance(batch, PackedBatch):
        clean = batch.tokens.to(device)
        shard = shard_of(batch.layout, cp_group)
        noise = torch.randn(clean.shape, dtype=clean.dtype).to(device)
    else:
        latents = batch.latents
        shard = shard_of(token_grid(latents.shape[2:], patch), cp_group)
        noise = patchify(torch.randn(latents.shape, dtype=latents.dtype), patch).to(device)
        clean = patchify(latents, patch).to(device)
    _check_channels(model, clean, packed=True)
    clean, noise = shard.split(clean), shard.split(noise)
    sigma_b = per_token(sigma, shard)

    def network(x_in: torch.Tensor, c_noise: torch.Tensor) -> torch.Tensor:
        with autocast:
            return model(x_in, c_noise, text, text_mask, drop_text=drop_text, shard=shard)

    denoised = edm.denoise(network, clean + sigma_b * noise, sigma, sigma_b)
    elementwise = edm.loss(denoised.float(), clean.float(), sigma_b.float())
    # Per-sample means for the loss-by-sigma metrics: sums of real tokens, added up over the group.
    real = shard.valid(device)
    per_token_loss = torch.where(real[None], elementwise.detach().mean(dim=-1), 0.0)  # (B, local)
    if shard.packed:
        sums = torch.zeros(n, device=device).index_add_(0, shard.token_sample(device), per_token_loss[0])
        counts = torch.tensor(shard.layout.seqlens, device=device, dtype=sums.dtype)
    else:
        sums = per_token_loss.sum(dim=1)
        counts = torch.full((n,), float(shard.total), device=device)
    dist.all_reduce(sums, group=cp_group)
    rows = 1 if shard.packed else n
    return MicroLoss(shard_loss(elementwise, shard), sigma.detach(), sums / counts, rows * shard.total)


def _check_channels(model: nn.Module, clean: torch.Tensor, packed: bool) -> None:
    """A model built for other latents fails deep inside a matmul; say what to change instead."""
    cfg = getattr(model, "config", None)
    if cfg is None:
        return
    pt, ph, pw = cfg.patch
    channels = clean.shape[-1] // (pt * ph * pw) if packed else clean.shape[1]
    if channels != cfg.in_channels:
        raise UserInputError(
            f"model.in_channels: the latents have {channels} channels (see the tokenizer in the data's index.json), "
            f"the model takes {cfg.in_channels}; set --set model.in_channels={channels}"
        )
