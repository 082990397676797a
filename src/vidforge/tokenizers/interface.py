"""What every video tokenizer offers (the pixel tokenizer and the diffusers VAEs subclass it; `base.build_tokenizer`
picks one), and the conversions between uint8 frames and model tensors.

Videos enter as (B, 3, F, H, W) floats in [-1, 1] with F = 4k+1 (causal: the first frame alone, then
groups of `temporal_compression`); latents are (B, C, 1 + (F-1)/ct, H/cs, W/cs), already normalised."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np
import torch


def frames_to_tensor(frames: np.ndarray) -> torch.Tensor:
    """(F, H, W, 3) uint8 -> (3, F, H, W) float32 in [-1, 1]."""
    return (
        torch.from_numpy(np.ascontiguousarray(frames))
        .permute(3, 0, 1, 2)
        .float()
        .div_(127.5)
        .sub_(1.0)
        .contiguous()
    )


def tensor_to_frames(video: torch.Tensor) -> np.ndarray:
    """(3, F, H, W) in [-1, 1] -> (F, H, W, 3) uint8 (rounded, clamped)."""
    x = (video.detach().float().cpu().clamp(-1, 1) + 1.0) * 127.5
    return x.round().to(torch.uint8).permute(1, 2, 3, 0).contiguous().numpy()


class VideoTokenizer(ABC):
    """Interface: `encode` (B, 3, F, H, W) -> normalised latents; `decode` is its inverse."""

    temporal_compression: int
    spatial_compression: int
    latent_channels: int
    device: torch.device

    @abstractmethod
    def encode(self, video: torch.Tensor) -> torch.Tensor:
        """(B, 3, F, H, W) in [-1, 1] -> normalised latents (B, C, T, h, w)."""

    @abstractmethod
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """The inverse of `encode`."""

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """What the latent shards' index records about the tokenizer."""

    def check_input(self, video: torch.Tensor) -> None:
        if video.ndim != 5 or video.shape[1] != 3:
            raise ValueError(f"expected video (B, 3, F, H, W), got {tuple(video.shape)}")
        f, h, w = video.shape[2:]
        ct, cs = self.temporal_compression, self.spatial_compression
        if (f - 1) % ct or h % cs or w % cs:
            raise ValueError(
                f"video of {f} frames {h}x{w}: frames must be {ct}k+1 and sizes multiples of {cs}"
            )

    def latent_shape(self, frames: int, height: int, width: int) -> tuple[int, int, int, int]:
        return (
            self.latent_channels,
            1 + (frames - 1) // self.temporal_compression,
            height // self.spatial_compression,
            width // self.spatial_compression,
        )
