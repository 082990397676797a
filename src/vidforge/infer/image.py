"""`vidforge infer --image PATH` for a model with `model.expand_timesteps` (Wan2.2 TI2V, LTX-2): the image's
latent as the first latent frame (`vidforge.sampling.first_frame`). The image is read and fitted by the
one reader every image-to-video path shares (`vidforge.tokenizers.image_condition.load_image` and
`fit_image`: diffusers' `VideoProcessor.preprocess`, after the family's H.264 re-compression where its
pipeline has one, LTX-2's) and encoded by the profile's tokenizer as a one-frame video (its normalised
latent, the pipeline's (z - mean) / std)."""

from __future__ import annotations

from pathlib import Path

import torch

from vidforge.families import family
from vidforge.profile import RunProfile
from vidforge.tokenizers.image_condition import fit_image, load_image
from vidforge.tokenizers.interface import VideoTokenizer


def first_frame_latent(profile: RunProfile, tokenizer: VideoTokenizer, path: str | Path) -> torch.Tensor:
    """The normalised latent (1, C, 1, h, w) the sampled videos start from (the layout rulebook's
    `sampling_run_problems` has refused a model or a run that cannot take an image)."""
    cfg, spec = profile.infer, family(profile.model.family)
    pixels, _ = fit_image(load_image(path), cfg.height, cfg.width, tokenizer.spatial_compression, spec)
    return tokenizer.encode(pixels[:, :, None].to(tokenizer.device)).float().cpu()
