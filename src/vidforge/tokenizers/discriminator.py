"""A 3D patch discriminator (PatchGAN over space and time): one logit per overlapping video patch."""

from __future__ import annotations

import torch
from torch import nn


class PatchDiscriminator3D(nn.Module):
    """Strided 3D convolutions (3 halvings of height and width, 1 of time) with group norm and leaky ReLU,
    then a 1-channel convolution: the logits of (B, 1, F', H/8, W/8) patches."""

    def __init__(self, channels: int = 32, layers: int = 3):
        super().__init__()
        blocks: list[nn.Module] = [nn.Conv3d(3, channels, 3, stride=(1, 2, 2), padding=1), nn.LeakyReLU(0.2)]
        width = channels
        for i in range(1, layers):
            stride = (2 if i == 1 else 1, 2, 2)
            blocks += [
                nn.Conv3d(width, width * 2, 3, stride=stride, padding=1),
                nn.GroupNorm(min(32, width * 2), width * 2),
                nn.LeakyReLU(0.2),
            ]
            width *= 2
        blocks.append(nn.Conv3d(width, 1, 3, padding=1))
        self.net = nn.Sequential(*blocks)

    def forward(self, video: torch.Tensor) -> torch.Tensor:
        return self.net(video)
