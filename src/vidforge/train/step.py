"""One micro-batch's EDM loss, for packed rows and for plain (bucketed) batches alike.

Noise levels, noise and caption dropout are drawn from torch's global generator, whose state the
checkpoint saves, so a resumed run draws exactly what an uninterrupted one would have."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import nn

from vidforge.data.packing import BucketBatch, PackedBatch
from vidforge.diffusion import EDM
from vidforge.errors import UserInputError


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
) -> MicroLoss:
    """Noise the clean latents, denoise with the preconditioned model, weight by lambda(sigma)."""
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
