"""Periodic validation during training: the EMA weights sample the profile's validation prompts into
MP4s and a contact sheet. Every rank takes part (an FSDP model needs all of them for a forward); rank 0
writes. The training weights are put back afterwards.

Not under pipeline parallel: sampling runs the whole model forward many times, and a pipeline rank holds
only its stages (there is no forward-only pipeline); the layout rulebook refuses that when the profile
loads."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn

from vidforge.data.shard_index import read_index
from vidforge.data.shard_reader import SampleError, ShardError, iter_shard
from vidforge.data.store import is_url
from vidforge.files import write_text
from vidforge.parallel.parallelize import forward_dtype
from vidforge.profile import RunProfile
from vidforge.sampling.latents import sample_latents
from vidforge.sampling.negative import negative_caption
from vidforge.sampling.shape import check_shape, slug
from vidforge.sampling.writers import contact_sheet, write_mp4
from vidforge.text.encoders import build_text_encoder
from vidforge.tokenizers.base import build_tokenizer
from vidforge.tokenizers.tokenize import decode
from vidforge.train.ema import EMA

DATA_PROMPTS = 3  # captions taken from the training data when train.validation_prompts is empty
AUTO_TIMES = 4  # a fine-tune's validations over its run when train.validate_every is unset


@dataclass(frozen=True)
class ValidationPlan:
    """When a run validates and with which prompts; `every` 0: never."""

    every: int
    prompts: tuple[str, ...]
    at_end: bool = False  # also at the run's last step
    note: str | None = None  # why validation is on or off when the profile did not say

    def due(self, step: int, last: int) -> bool:
        return bool(self.every) and (step % self.every == 0 or (self.at_end and step == last))


def plan_validation(profile: RunProfile, data: Sequence[str | Path], fine_tune: bool) -> ValidationPlan:
    """train.validate_every, or for a fine-tune (--init, train.lora) left unset, four validations and one
    at the end; train.validation_prompts, or the first few distinct captions of the data."""
    cfg = profile.train
    if profile.model.samples_from_image:  # sampling needs a first frame per prompt, which prompts lack
        return ValidationPlan(
            0, (), note="validation off: an image-to-video model samples from `infer --image`"
        )
    every, at_end, note = cfg.validate_every or 0, False, None
    if cfg.validate_every is None and fine_tune:
        if profile.parallel.pp > 1:
            return ValidationPlan(
                0, (), note="validation off: a pipeline rank cannot sample (parallel.pp > 1)"
            )
        if cfg.expert is not None:  # its samples would run one expert over the other's times too
            return ValidationPlan(
                0,
                (),
                note=f"validation off: the {cfg.expert}-noise expert alone cannot sample a two-expert model; "
                "sample the run as a LoRA on the download (infer -c DOWNLOAD --lora RUN)",
            )
        every, at_end = math.ceil(cfg.steps / AUTO_TIMES), True
        note = f"validation on (a fine-tune): every {every} steps and at step {cfg.steps}"
    if not every:
        return ValidationPlan(0, ())
    prompts = cfg.validation_prompts or data_captions(data, DATA_PROMPTS)
    if not prompts:
        return ValidationPlan(
            0,
            (),
            note="validation off: no train.validation_prompts and no captions in the data to take them from",
        )
    if not cfg.validation_prompts:
        note = f"{note or 'validation'}; prompts (the data's first captions): {'; '.join(prompts)}"
    return ValidationPlan(every, tuple(prompts), at_end, note)


def data_captions(data: Sequence[str | Path], limit: int) -> tuple[str, ...]:
    """The first `limit` distinct non-empty captions of local latent shards (their `txt` members), in index
    order; none from remote data (validation would fetch shards just for their captions)."""
    found: list[str] = []
    for root in data:
        if is_url(str(root)):
            continue
        index = read_index(root)
        for entry in index.shards:
            try:
                for sample in iter_shard(index.path(entry), entry, verify="count"):
                    caption = str(sample.get("txt") or "").strip()
                    if caption and caption not in found:
                        found.append(caption)
                    if len(found) == limit:
                        return tuple(found)
            except (ShardError, SampleError):
                continue  # the loader reports a bad shard; a caption can come from the next one
    return tuple(found)


class Sample(NamedTuple):
    prompt: str
    frames: np.ndarray  # (T, H, W, 3) uint8
    video: Path  # its MP4


class Validator:
    """A run's validation: its tokenizer (to decode) and its prompts' text embeddings made at the first
    validation and kept for the later ones (a fine-tune's text encoder is large: loaded once, then let go)."""

    def __init__(self, profile: RunProfile, prompts: Sequence[str]) -> None:
        self.profile = profile
        self.prompts = list(prompts)
        self._tokenizer: Any = None
        self._text: tuple[torch.Tensor, torch.Tensor] | None = None
        self._negative: tuple[torch.Tensor, torch.Tensor] | None = None  # infer's rule: negative_caption

    @torch.no_grad()
    def __call__(self, model: nn.Module, ema: EMA | None, out: Path, rank: int) -> list[Sample]:
        """Sample the prompts with the EMA weights into `out`: one MP4 a prompt, a contact sheet and
        prompts.json (file -> prompt). Returns rank 0's samples; [] elsewhere."""
        profile, prompts = self.profile, self.prompts
        if self._tokenizer is None:
            self._tokenizer = build_tokenizer(profile, device=str(next(model.parameters()).device))
        shape = check_shape(profile, self._tokenizer)
        if self._text is None:
            encoder = build_text_encoder(profile)
            self._text = encoder.encode_to_sample(prompts)
            self._negative = negative_caption(profile, encoder)
        backup = [p.detach().clone() for p in model.parameters()] if ema is not None else None
        if ema is not None:
            ema.copy_to(model)
        model.eval()
        try:
            seeds = [profile.infer.seed + i for i in range(len(prompts))]
            # under FSDP2 the forward computes in its bf16 all-gather under autocast, as training's does
            dtype, device = forward_dtype(model, profile), next(model.parameters()).device.type
            with torch.autocast(device, dtype=dtype) if dtype else nullcontext():
                latents = sample_latents(model, profile, *self._text, seeds, shape, self._negative)
        finally:
            model.train()
            _reshard(model)
            if backup is not None:
                for p, saved in zip(model.parameters(), backup, strict=True):
                    p.copy_(saved)
        if rank != 0:
            return []
        out.mkdir(parents=True, exist_ok=True)
        videos = [decode(self._tokenizer, z.float().cpu()) for z in latents]
        for prompt, frames in zip(prompts, videos, strict=True):
            write_mp4(out / f"{slug(prompt)}.mp4", frames, profile.infer.fps, profile.infer.crf)
        contact_sheet(out / "contact_sheet.png", videos, prompts)
        names = {f"{slug(p)}.mp4": p for p in prompts}
        write_text(out / "prompts.json", json.dumps(names, ensure_ascii=False, indent=1))
        return [Sample(p, frames, out / f"{slug(p)}.mp4") for p, frames in zip(prompts, videos, strict=True)]


def _reshard(model: nn.Module) -> None:
    """FSDP2 leaves the root module's parameters gathered after a forward (the backward would need them at
    once): sharded again here, as the backup of the training weights and the optimizer hold them."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def validate(
    profile: RunProfile,
    model: nn.Module,
    ema: EMA | None,
    out: Path,
    rank: int,
    prompts: Sequence[str] | None = None,
) -> list[Sample]:
    """One validation of `prompts` (default train.validation_prompts): see `Validator`."""
    chosen = prompts if prompts is not None else profile.train.validation_prompts
    return Validator(profile, chosen)(model, ema, out, rank)
