"""The wan family's image-to-video condition latents, as diffusers' `WanImageToVideoPipeline` builds them
(Wan2.1-I2V, its `prepare_latents`): the video [first frame, zeros...] of the clip's frame count through
the VAE (posterior mode, normalised), after a mask of `temporal_compression` channels per latent frame
that is one on the first latent frame (the first frame's mask, repeated for each frame the VAE folds into
latent frame 0) and zero elsewhere. The model reads these `model.condition_channels` channels after the
noisy latents' (36 = 16 + 4 + 16). `tokenize`, training and `infer --image` reach it through
`FamilySpec.condition_latents`."""

from __future__ import annotations

import torch

from vidforge.tokenizers.interface import VideoTokenizer


def first_frame_mask(
    batch: int, latent_frames: int, height: int, width: int, temporal_compression: int
) -> torch.Tensor:
    """(batch, temporal_compression, latent_frames, height, width): ones on latent frame 0, zeros after.
    The pipeline builds it per video frame (the first one), repeats the first frame's mask
    `temporal_compression` times and folds each group of that many frames into one latent frame's
    channels: which is this."""
    mask = torch.zeros(batch, temporal_compression, latent_frames, height, width)
    mask[:, :, 0] = 1.0
    return mask


def condition_latents(tokenizer: VideoTokenizer, first_frame: torch.Tensor, frames: int) -> torch.Tensor:
    """first_frame (B, 3, H, W) in [-1, 1] -> (B, temporal_compression + C, T, H/cs, W/cs): the first
    frame's mask, then the normalised latents of [first frame, `frames` - 1 zero frames]."""
    if first_frame.ndim != 4 or first_frame.shape[1] != 3:
        raise ValueError(f"first_frame must be (B, 3, H, W), got {tuple(first_frame.shape)}")
    b, _, h, w = first_frame.shape
    video = torch.cat([first_frame[:, :, None], first_frame.new_zeros(b, 3, frames - 1, h, w)], dim=2)
    latents = tokenizer.encode(video).float()
    mask = first_frame_mask(b, *latents.shape[2:], tokenizer.temporal_compression).to(latents.device)
    return torch.cat([mask, latents], dim=1)


def condition_channels(tokenizer: VideoTokenizer) -> int:
    """The channels `condition_latents` gives with this tokenizer."""
    return tokenizer.temporal_compression + tokenizer.latent_channels
