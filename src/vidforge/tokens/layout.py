"""Packed sequences: several samples of different (T, H, W) in one token row.

A `SequenceLayout` lists the token grid of every sample in the row; everything else is derived from
it: lengths and cumulative offsets (cu_seqlens), the sample each token belongs to, positions for RoPE
that restart at every sample, and the attention segments that keep samples apart. The data loader
produces layouts; the model reads them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from vidforge.token_grid import Grid, token_grid
from vidforge.tokens.masks import Segments
from vidforge.tokens.patchify import patchify, unpatchify


@dataclass(frozen=True)
class SequenceLayout:
    """The token grids (T', H', W') of the samples packed, in order, into one row of tokens."""

    grids: tuple[Grid, ...]

    def __post_init__(self) -> None:
        grids = tuple(tuple(int(n) for n in g) for g in self.grids)
        if not grids:
            raise ValueError("SequenceLayout needs at least one sample")
        for i, grid in enumerate(grids):
            if len(grid) != 3 or min(grid) < 1:
                raise ValueError(
                    f"SequenceLayout.grids[{i}] must be three positive sizes (t, h, w), got {grid}"
                )
        object.__setattr__(self, "grids", grids)

    @classmethod
    def from_latent_shapes(cls, shapes: Sequence[Sequence[int]], patch: Sequence[int]) -> SequenceLayout:
        """From latent sizes (T, H, W) per sample (or (C, T, H, W): the channel entry is ignored)."""
        return cls(tuple(token_grid(tuple(s)[-3:], patch) for s in shapes))

    @property
    def num_samples(self) -> int:
        return len(self.grids)

    @property
    def seqlens(self) -> tuple[int, ...]:
        return tuple(t * h * w for t, h, w in self.grids)

    @property
    def total(self) -> int:
        return sum(self.seqlens)

    @property
    def offsets(self) -> tuple[int, ...]:
        """Cumulative offsets (N+1 host integers): sample i holds tokens [offsets[i], offsets[i+1])."""
        out = [0]
        for n in self.seqlens:
            out.append(out[-1] + n)
        return tuple(out)

    def cu_seqlens(self, device: torch.device | str = "cpu") -> torch.Tensor:
        return torch.tensor(self.offsets, dtype=torch.int32, device=device)

    def sample_index(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """(S,) index of the sample each token belongs to."""
        return torch.repeat_interleave(  # output_size: no device sync, and the meta device can run it
            torch.arange(self.num_samples, device=device),
            torch.tensor(self.seqlens, device=device),
            output_size=self.total,
        )

    def per_token(self, values: torch.Tensor) -> torch.Tensor:
        """Per-sample values (N, ...) spread to the tokens: (1, S, ...). E.g. sigma (N,) -> (1, S), and
        `per_token(sigma)[..., None]` broadcasts against packed tokens (1, S, features)."""
        if values.shape[0] != self.num_samples:
            raise ValueError(
                f"expected one value per packed sample ({self.num_samples}), got {values.shape[0]}"
            )
        return values[self.sample_index(values.device)].unsqueeze(0)

    def positions(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """(S, 3) integer (t, h, w) position of every token, restarting at each sample."""
        return torch.cat([grid_positions(g, device) for g in self.grids])

    # Attention segments ------------------------------------------------------------------------------

    def segments(self) -> Segments:
        """Full self-attention within each sample."""
        return Segments.self_attention(self.seqlens)

    def frame_segments(self) -> Segments:
        """Spatial attention: one segment per frame of every sample (tokens are t-major, so contiguous)."""
        return Segments.self_attention([h * w for t, h, w in self.grids for _ in range(t)])

    def position_segments(self) -> Segments:
        """Temporal attention, over tokens reordered by `temporal_order`: one segment per (h, w) position."""
        return Segments.self_attention([t for t, h, w in self.grids for _ in range(h * w)])

    def temporal_order(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """(S,) permutation that puts each position's frames next to each other: token order (t, h, w)
        within a sample becomes (h, w, t). Its inverse is `argsort` of it."""
        parts = []
        for offset, (t, h, w) in zip(self.offsets, self.grids, strict=False):
            parts.append(offset + torch.arange(t * h * w, device=device).view(t, h * w).T.reshape(-1))
        return torch.cat(parts)


def grid_positions(grid: Sequence[int], device: torch.device | str = "cpu") -> torch.Tensor:
    """(t*h*w, 3) integer positions of a token grid in t-major order."""
    t, h, w = grid
    axes = torch.meshgrid(
        torch.arange(t, device=device),
        torch.arange(h, device=device),
        torch.arange(w, device=device),
        indexing="ij",
    )
    return torch.stack(axes, dim=-1).reshape(-1, 3)


def pack_latents(
    latents: Sequence[torch.Tensor], patch: Sequence[int]
) -> tuple[torch.Tensor, SequenceLayout]:
    """Latents (C, T_i, H_i, W_i) of different sizes -> one row of patch tokens (1, S, pt*ph*pw*C) and
    its layout."""
    if not latents:
        raise ValueError("pack_latents needs at least one latent")
    channels = {x.shape[0] for x in latents}
    if len(channels) != 1 or any(x.ndim != 4 for x in latents):
        raise ValueError(
            f"pack_latents takes (C, T, H, W) latents with one C, got shapes {[tuple(x.shape) for x in latents]}"
        )
    layout = SequenceLayout.from_latent_shapes([x.shape for x in latents], patch)
    tokens = torch.cat([patchify(x.unsqueeze(0), patch) for x in latents], dim=1)
    return tokens, layout


def unpack_tokens(tokens: torch.Tensor, layout: SequenceLayout, patch: Sequence[int]) -> list[torch.Tensor]:
    """The inverse of `pack_latents`: (1, S, pt*ph*pw*C) -> [(C, T_i, H_i, W_i), ...]."""
    if tokens.ndim != 3 or tokens.shape[0] != 1 or tokens.shape[1] != layout.total:
        raise ValueError(f"packed tokens must be (1, {layout.total}, features), got {tuple(tokens.shape)}")
    pt, ph, pw = patch
    channels = tokens.shape[2] // (pt * ph * pw)
    out = []
    for start, end, grid in zip(layout.offsets[:-1], layout.offsets[1:], layout.grids, strict=True):
        out.append(unpatchify(tokens[:, start:end], grid, patch, channels)[0])
    return out
