"""`vidforge infer --image PATH`: the image a video starts from, as the model's condition. For a model
with `model.expand_timesteps` (Wan2.2 TI2V) that is the image's latent as the first latent frame
(`vidforge.sampling.first_frame`); the image is read as diffusers' `VideoProcessor.preprocess` reads it
(RGB, resized to the video's size with Lanczos, 2 x / 255 - 1) and encoded by the profile's tokenizer
as a one-frame video (its normalised latent, the pipeline's (z - mean) / std)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from vidforge.errors import UserInputError
from vidforge.profile import RunProfile
from vidforge.tokenizers.interface import VideoTokenizer


def read_image(path: str | Path, height: int, width: int) -> torch.Tensor:
    """The image at `path` as a one-frame video (1, 3, 1, height, width) in [-1, 1]."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as opened:
            image = opened.convert("RGB")
    except (OSError, UnidentifiedImageError) as err:
        raise UserInputError(
            f"--image {path}: not an image this can read ({err}); give a PNG or JPEG"
        ) from None
    if image.size != (width, height):
        image = image.resize((width, height), resample=Image.LANCZOS)
    pixels = torch.from_numpy(np.asarray(image).astype(np.float32) / 255.0)
    return (2.0 * pixels - 1.0).permute(2, 0, 1)[None, :, None]


def image_condition(
    profile: RunProfile, tokenizer: VideoTokenizer, path: str | Path, world: int = 1
) -> torch.Tensor:
    """The normalised latent (1, C, 1, h, w) the sampled videos start from, or a UserInputError where
    the model or the run cannot take an image."""
    if not profile.model.expand_timesteps:
        raise UserInputError(
            f"--image: model.family={profile.model.family} with model.expand_timesteps off samples from text "
            "only; drop --image, or sample an image-conditioned model (e.g. Wan2.2 TI2V)"
        )
    if world > 1:
        raise UserInputError(
            f"--image: image-conditioned sampling runs in one process, not over {world}; drop --nproc"
        )
    video = read_image(path, profile.infer.height, profile.infer.width)
    return tokenizer.encode(video).float().cpu()
