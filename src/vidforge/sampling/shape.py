"""The latent shape of the videos a profile samples, and the file names they are written under."""

from __future__ import annotations

import re

from vidforge.errors import UserInputError
from vidforge.profile import RunProfile
from vidforge.token_grid import clip_tokens
from vidforge.tokenizers.base import VideoTokenizer


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


def sampled_tokens(profile: RunProfile) -> int:
    """The video tokens of a sample at infer's frames x height x width, the count a token-count shift
    (`diffusion.flow_shift_tokens`) reads."""
    cfg, tok = profile.infer, profile.tokenizer
    return clip_tokens(
        cfg.frames,
        cfg.height,
        cfg.width,
        (tok.temporal_compression, tok.spatial_compression),
        profile.model.patch,
    )


def slug(text: str, limit: int = 40) -> str:
    """A file-name-safe stem of a prompt."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:limit] or "prompt"
