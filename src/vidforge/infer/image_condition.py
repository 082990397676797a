"""`vidforge infer --image PATH` for image-to-video models with condition channels (Wan2.1-I2V; first-frame
conditioning, Wan2.2 TI2V's, is `vidforge.infer.image`'s): what the network reads beside the noisy latents
(its family's condition latents of the image at the video's size, `FamilySpec.condition_latents`) and
the image's embedding (model.image_dim > 0: the profile's tokenizer.image_encoder), held for the whole
run, and the forward that hands them to every call of the sampler, both guidance branches included
(WanImageToVideoPipeline conditions its unconditional branch on the same image)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from vidforge.errors import UserInputError
from vidforge.families import family, load
from vidforge.profile import RunProfile
from vidforge.profile.overrides import Override, Settings, as_overrides
from vidforge.tokenizers.image_condition import build_image_encoder, fit_image, load_image
from vidforge.tokenizers.interface import VideoTokenizer


@dataclass(frozen=True)
class ImageCondition:
    """One image's conditioning: `latents` (1, condition_channels, T, h, w), `embedding` (1, L, image_dim)
    or None."""

    latents: torch.Tensor
    embedding: torch.Tensor | None

    def forward(self, model: nn.Module) -> Callable[..., torch.Tensor]:
        """`model`'s forward with this image's conditioning repeated for every row of the batch."""

        moved: dict = {}  # (device, dtype) -> the conditioning there: copied once, not at every call

        def forward(x, noise_level, text, text_mask=None, drop_text=None):
            rows, where = x.shape[0], (x.device, x.dtype)
            if where not in moved:
                embedding = None if self.embedding is None else self.embedding.to(*where)
                moved[where] = (self.latents.to(*where), embedding)
            latents, embedding = moved[where]
            latents = latents.expand(rows, -1, -1, -1, -1)
            if embedding is not None:
                embedding = embedding.expand(rows, -1, -1)
            return model(
                x, noise_level, text, text_mask, drop_text=drop_text, condition=latents, image=embedding
            )

        return forward


SIZE = ("infer.height", "infer.width")


def image_size_sets(prof: RunProfile, image: str | Path, overrides: Settings) -> list[Override]:
    """The video size the model family's image-to-video pipeline picks for `image` (`FamilySpec.image_size`)
    as the overrides that set it; none when the family has no such rule or `overrides` set a size."""
    rule = family(prof.model.family).image_size
    if rule is None or any(o.key in (*SIZE, "infer") for o in as_overrides(overrides)):
        return []
    width, height = load_image(image).size
    size = rule(prof.model, height, width, prof.tokenizer.spatial_compression)
    return as_overrides(dict(zip(SIZE, size, strict=True)))


def channel_condition(
    profile: RunProfile, tokenizer: VideoTokenizer, image: str | Path | None
) -> ImageCondition | None:
    """The conditioning of `image` at the profile's infer size for a model with condition channels; None
    for any other model (`vidforge.infer.image` owns first-frame conditioning). The layout rulebook's
    `sampling_run_problems` has refused a model that needs an image and got none, and a run over
    several processes."""
    model = profile.model
    if not model.condition_channels or image is None:
        return None
    build = family(model.family).condition_latents
    if build is None:
        raise ValueError(f"family {model.family}: condition_channels without FamilySpec.condition_latents")
    cfg = profile.infer
    spec = family(model.family)
    first, seen = fit_image(load_image(image), cfg.height, cfg.width, tokenizer.spatial_compression, spec)
    latents = load(build)(tokenizer, first.to(tokenizer.device), cfg.frames).cpu()
    if latents.shape[1] != model.condition_channels:
        raise UserInputError(
            f"tokenizer: gives {latents.shape[1]} condition channels but the model reads "
            f"model.condition_channels={model.condition_channels}; use the VAE the model was trained with"
        )
    embedding = None
    if model.image_dim:
        encoder = build_image_encoder(model, profile.tokenizer.image_encoder, tokenizer.device)
        embedding = encoder.encode([seen]).cpu()
    return ImageCondition(latents, embedding)
