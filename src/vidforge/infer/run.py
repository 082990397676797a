"""`vidforge infer`: prompts -> text encoder -> sampler over the DiT -> tokenizer decode -> MP4 + PNG.

The checkpoint is a training run directory (its `export/`) or an export folder itself; its `profile.yaml`
is the base profile, so the tokenizer and text encoder are the ones the model was trained with."""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from vidforge.data.manifest import write_jsonl
from vidforge.errors import UserInputError
from vidforge.infer.sampling import sample_latents
from vidforge.infer.writers import contact_sheet, write_mp4
from vidforge.models import load_model
from vidforge.models.checkpoint import WEIGHTS
from vidforge.profile import RunProfile, load_profile
from vidforge.text.encoders import build_text_encoder
from vidforge.tokenizers.base import VideoTokenizer, build_tokenizer
from vidforge.tokenizers.tokenize import decode


def find_export(checkpoint: str | Path) -> Path:
    """The folder holding model.safetensors + config.json: CHECKPOINT/export or CHECKPOINT itself."""
    path = Path(checkpoint)
    for candidate in (path / "export", path):
        if (candidate / WEIGHTS).is_file():
            return candidate
    raise UserInputError(
        f"--checkpoint {checkpoint}: no {WEIGHTS} in it or in its export/; point at a `vidforge train` run "
        "directory that finished (or an export folder)"
    )


def checkpoint_profile(export: Path, overrides: Sequence[str], profile: str | None = None) -> RunProfile:
    """The profile the model trained with (or `profile` if given), with `overrides` applied."""
    base = profile if profile is not None else export / "profile.yaml"
    if profile is None and not Path(base).is_file():
        raise UserInputError(f"{export}: no profile.yaml beside the weights; pass --profile")
    return load_profile(base, overrides)


def check_shape(profile: RunProfile, tokenizer: VideoTokenizer) -> tuple[int, int, int, int]:
    """The latent shape for profile.infer's frames x height x width, or a UserInputError saying what fits."""
    cfg, (pt, ph, pw) = profile.infer, profile.model.patch
    ct, cs = tokenizer.temporal_compression, tokenizer.spatial_compression
    if (cfg.frames - 1) % ct:
        raise UserInputError(
            f"infer.frames: the tokenizer needs {ct}k+1 frames, got {cfg.frames}; e.g. --set infer.frames={ct * ((cfg.frames - 1) // ct) + 1}"
        )
    for name, size, patch in (("height", cfg.height, ph), ("width", cfg.width, pw)):
        if size % (cs * patch):
            raise UserInputError(
                f"infer.{name}: must be a multiple of {cs * patch} (tokenizer {cs}x x patch {patch}), got {size}"
            )
    shape = tokenizer.latent_shape(cfg.frames, cfg.height, cfg.width)
    if shape[1] % pt:
        raise UserInputError(f"infer.frames: {shape[1]} latent frames are not a multiple of the patch's {pt}")
    if shape[0] != profile.model.in_channels:
        raise UserInputError(
            f"tokenizer: gives {shape[0]} latent channels but the model takes model.in_channels={profile.model.in_channels}"
        )
    return shape


def slug(text: str, limit: int = 40) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:limit] or "prompt"


@dataclass
class InferResult:
    videos: list[str]
    contact_sheet: str
    seconds: float
    seconds_per_video: float


def run(
    checkpoint: str | Path,
    prompts: Sequence[str],
    out: str | Path,
    *,
    overrides: Sequence[str] = (),
    profile: str | None = None,
) -> InferResult:
    if not prompts or any(not p.strip() for p in prompts):
        raise UserInputError(
            "--prompt: give at least one non-empty prompt (or --prompts-file with one per line)"
        )
    export = find_export(checkpoint)
    prof = checkpoint_profile(export, overrides, profile)
    device = "cuda" if prof.cluster.accelerator.kind == "cuda" and torch.cuda.is_available() else "cpu"
    tokenizer = build_tokenizer(prof, device=device)
    latent_shape = check_shape(prof, tokenizer)
    encoder = build_text_encoder(prof)
    model = load_model(export, device=device).eval()
    if model.config.text_dim != encoder.width:
        raise UserInputError(
            f"text_encoder: gives {encoder.width}-wide states but the model was trained on text_dim={model.config.text_dim}"
        )
    negative = None
    if prof.infer.negative_prompt:
        neg_emb, neg_mask = encoder.encode([prof.infer.negative_prompt])
        negative = (torch.from_numpy(neg_emb.astype(np.float32)), torch.from_numpy(neg_mask))

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    records, videos, labels = [], [], []
    size = prof.infer.batch_size
    for first in range(0, len(prompts), size):
        chunk = list(prompts[first : first + size])
        emb, mask = encoder.encode(chunk)
        seeds = [prof.infer.seed + first + i for i in range(len(chunk))]
        latents = sample_latents(
            model,
            prof,
            torch.from_numpy(emb.astype(np.float32)),
            torch.from_numpy(mask),
            seeds,
            latent_shape,
            negative,
        )
        for i, (prompt, seed) in enumerate(zip(chunk, seeds, strict=True)):
            frames = decode(tokenizer, latents[i].float().cpu())
            path = out / f"{first + i:03d}_{slug(prompt)}.mp4"
            write_mp4(path, frames, prof.infer.fps, prof.infer.crf)
            videos.append(frames)
            labels.append(prompt)
            records.append(
                {
                    "prompt": prompt,
                    "seed": seed,
                    "video": path.name,
                    "frames": len(frames),
                    "height": frames.shape[1],
                    "width": frames.shape[2],
                }
            )
    seconds = time.perf_counter() - started
    sheet = out / "contact_sheet.png"
    contact_sheet(sheet, videos, labels)
    write_jsonl(out / "samples.jsonl", records)
    return InferResult([str(out / r["video"]) for r in records], str(sheet), seconds, seconds / len(records))
