"""`vidforge infer --image PATH` for a model with `model.expand_timesteps` (Wan2.2 TI2V): the image's
latent as the first latent frame (`vidforge.sampling.first_frame`). The image is read and resized by the
one reader both image-to-video paths share (`vidforge.tokenizers.image_condition.load_image` and
`preprocess_image`: diffusers' `VideoProcessor.preprocess`, which WanImageToVideoPipeline runs with and
without expand_timesteps) and encoded by the profile's tokenizer as a one-frame video (its normalised
latent, the pipeline's (z - mean) / std)."""

from __future__ import annotations

from pathlib import Path

import torch

from vidforge.profile import RunProfile
from vidforge.tokenizers.image_condition import load_image, preprocess_image
from vidforge.tokenizers.interface import VideoTokenizer


def first_frame_latent(profile: RunProfile, tokenizer: VideoTokenizer, path: str | Path) -> torch.Tensor:
    """The normalised latent (1, C, 1, h, w) the sampled videos start from (the layout rulebook's
    `sampling_run_problems` has refused a model or a run that cannot take an image)."""
    cfg = profile.infer
    pixels = preprocess_image(load_image(path), cfg.height, cfg.width, tokenizer.spatial_compression)
    return tokenizer.encode(pixels[:, :, None].to(tokenizer.device)).float().cpu()
