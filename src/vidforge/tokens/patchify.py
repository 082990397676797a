"""3D patchify: a latent video (C, T, H, W) becomes a sequence of tokens, one per (pt, ph, pw) patch.

Tokens are ordered t-major, then h, then w (row-major over the token grid), which is the order
`SequenceLayout.positions` assumes. A token's features are ordered (pt, ph, pw, C).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vidforge.token_grid import token_grid


def patchify(x: torch.Tensor, patch: Sequence[int]) -> torch.Tensor:
    """(B, C, T, H, W) latents -> (B, T'*H'*W', pt*ph*pw*C) tokens."""
    if x.ndim != 5:
        raise ValueError(f"patchify expects latents of shape (B, C, T, H, W), got {tuple(x.shape)}")
    b, c, t, h, w = x.shape
    gt, gh, gw = token_grid((t, h, w), patch)
    pt, ph, pw = patch
    x = x.reshape(b, c, gt, pt, gh, ph, gw, pw)
    x = x.permute(0, 2, 4, 6, 3, 5, 7, 1)  # b, gt, gh, gw, pt, ph, pw, c
    return x.reshape(b, gt * gh * gw, pt * ph * pw * c)


def unpatchify(
    tokens: torch.Tensor, grid: Sequence[int], patch: Sequence[int], channels: int
) -> torch.Tensor:
    """(B, T'*H'*W', pt*ph*pw*C) tokens -> (B, C, T, H, W) latents; the inverse of `patchify`."""
    b, s, features = tokens.shape
    gt, gh, gw = grid
    pt, ph, pw = patch
    if s != gt * gh * gw or features != pt * ph * pw * channels:
        raise ValueError(
            f"tokens of shape {tuple(tokens.shape)} do not match grid {tuple(grid)}, patch {tuple(patch)} "
            f"and {channels} channels (expected (B, {gt * gh * gw}, {pt * ph * pw * channels}))"
        )
    x = tokens.reshape(b, gt, gh, gw, pt, ph, pw, channels)
    x = x.permute(0, 7, 1, 4, 2, 5, 3, 6)  # b, c, gt, pt, gh, ph, gw, pw
    return x.reshape(b, channels, gt * pt, gh * ph, gw * pw)
