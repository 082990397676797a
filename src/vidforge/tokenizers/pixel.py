"""A weight-free tokenizer: space-to-depth by the VAEs' compression factors (demo and tests).

Causal like the VAEs: the first frame forms the first latent frame alone (repeated `ct` times to fill
the channels), every later group of `ct` frames one more. Latent channels are 3 x ct x cs x cs.
`decode(encode(x)) == x` exactly."""

from __future__ import annotations

from typing import Any

import torch

from vidforge.tokenizers.interface import VideoTokenizer


class PixelTokenizer(VideoTokenizer):
    def __init__(self, temporal_compression: int = 4, spatial_compression: int = 8, device: Any = "cpu"):
        self.temporal_compression, self.spatial_compression = temporal_compression, spatial_compression
        self.latent_channels = 3 * temporal_compression * spatial_compression**2
        self.device = torch.device(device)

    def encode(self, video: torch.Tensor) -> torch.Tensor:
        self.check_input(video)
        ct, cs = self.temporal_compression, self.spatial_compression
        x = torch.cat([video[:, :, :1].expand(-1, -1, ct, -1, -1), video[:, :, 1:]], dim=2)
        b, c, f, h, w = x.shape
        x = x.reshape(b, c, f // ct, ct, h // cs, cs, w // cs, cs)
        x = x.permute(0, 1, 3, 5, 7, 2, 4, 6)  # b, c, ct, cs, cs, T, H, W
        return x.reshape(b, c * ct * cs * cs, f // ct, h // cs, w // cs).contiguous()

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        ct, cs = self.temporal_compression, self.spatial_compression
        b, ch, t, h, w = latents.shape
        if ch != self.latent_channels:
            raise ValueError(f"pixel tokenizer latents have {self.latent_channels} channels, got {ch}")
        x = latents.reshape(b, 3, ct, cs, cs, t, h, w).permute(0, 1, 5, 2, 6, 3, 7, 4)
        x = x.reshape(b, 3, t * ct, h * cs, w * cs)
        return torch.cat([x[:, :, :1], x[:, :, ct:]], dim=2)  # the first group holds the first frame ct times

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "pixel",
            "temporal_compression": self.temporal_compression,
            "spatial_compression": self.spatial_compression,
            "latent_channels": self.latent_channels,
            "normalized": False,
        }
