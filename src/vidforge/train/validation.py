"""Periodic validation during training: the EMA weights sample the profile's validation prompts into
MP4s and a contact sheet. Every rank takes part (an FSDP model needs all of them for a forward); rank 0
writes. The training weights are put back afterwards.

Not under pipeline parallel: sampling runs the whole model forward many times, and a pipeline rank holds
only its stages (there is no forward-only pipeline); the layout rulebook refuses that when the profile
loads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from vidforge.infer.run import check_shape, slug
from vidforge.infer.sampling import sample_latents
from vidforge.infer.writers import contact_sheet, write_mp4
from vidforge.profile import RunProfile
from vidforge.text.encoders import build_text_encoder
from vidforge.tokenizers.base import build_tokenizer
from vidforge.tokenizers.tokenize import decode
from vidforge.train.ema import EMA


@torch.no_grad()
def validate(profile: RunProfile, model: nn.Module, ema: EMA | None, out: Path, rank: int) -> None:
    device = next(model.parameters()).device
    tokenizer = build_tokenizer(profile, device=str(device))
    shape = check_shape(profile, tokenizer)
    prompts = list(profile.train.validation_prompts)
    emb, mask = build_text_encoder(profile).encode(prompts)
    backup = [p.detach().clone() for p in model.parameters()] if ema is not None else None
    if ema is not None:
        ema.copy_to(model)
    model.eval()
    try:
        seeds = [profile.infer.seed + i for i in range(len(prompts))]
        latents = sample_latents(
            model, profile, torch.from_numpy(emb.astype(np.float32)), torch.from_numpy(mask), seeds, shape
        )
    finally:
        model.train()
        if backup is not None:
            for p, saved in zip(model.parameters(), backup, strict=True):
                p.copy_(saved)
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        videos = [decode(tokenizer, z.float().cpu()) for z in latents]
        for prompt, frames in zip(prompts, videos, strict=True):
            write_mp4(out / f"{slug(prompt)}.mp4", frames, profile.infer.fps, profile.infer.crf)
        contact_sheet(out / "contact_sheet.png", videos, prompts)
