"""3D rotary position embedding: the head dimension is split into t, h and w parts, each rotated by
its own axis position (Wan's split: h and w get 2*(d//6) channels each, t the rest, so every part is
even). Because RoPE only encodes relative offsets, the same tables serve full, spatial (constant t)
and temporal (constant h, w) attention."""

from __future__ import annotations

import torch


def axis_dims(head_dim: int) -> tuple[int, int, int]:
    """Channels of the head dimension given to the t, h and w axes."""
    if head_dim % 2 or head_dim < 6:
        raise ValueError(f"head_dim must be even and >= 6 for 3D rotary embeddings, got {head_dim}")
    spatial = 2 * (head_dim // 6)
    return head_dim - 2 * spatial, spatial, spatial


def rope_tables(
    positions: torch.Tensor, head_dim: int, theta: float = 10000.0, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables for integer positions (S, 3) = (t, h, w): each (S, head_dim // 2)."""
    angles = []
    for axis, dim in enumerate(axis_dims(head_dim)):
        freqs = theta ** (-torch.arange(0, dim, 2, dtype=torch.float64, device=positions.device) / dim)
        angles.append(positions[:, axis, None].to(torch.float64) * freqs[None, :])
    angle = torch.cat(angles, dim=-1)
    return angle.cos().to(dtype), angle.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate consecutive channel pairs (x[2i], x[2i+1]) of x (B, S, heads, head_dim) by the angles whose
    cos/sin are (S, head_dim/2) or (B, S, head_dim/2). Computed in float32 (float64 stays float64)."""
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    if cos.ndim == 2:
        cos, sin = cos[None], sin[None]
    cos = cos[:, :, None, :].to(compute)
    sin = sin[:, :, None, :].to(compute)
    # unbind, not two selects: its backward is one stack, where each select's allocates and fills a
    # zero tensor of the whole input
    x1, x2 = x.to(compute).unflatten(-1, (-1, 2)).unbind(-1)
    rotated = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return rotated.flatten(-2).to(x.dtype)


def sincos_position_embedding(
    positions: torch.Tensor, hidden: int, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Fixed absolute embedding (S, hidden) of integer positions (S, 3): the hidden size split into t, h
    and w parts as for RoPE, each half sines and half cosines of the axis position at geometric
    frequencies from 1 to 1/10000 (the Transformer's and DiT's embedding, per axis)."""
    parts = []
    for axis, dim in enumerate(axis_dims(hidden)):
        freqs = 10000.0 ** (-torch.arange(0, dim, 2, dtype=torch.float64, device=positions.device) / dim)
        angle = positions[:, axis, None].to(torch.float64) * freqs[None, :]
        parts += [angle.sin(), angle.cos()]
    return torch.cat(parts, dim=-1).to(dtype)
