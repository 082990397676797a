"""Packed sequences: several samples of different (T, H, W) in one token row.

A `SequenceLayout` lists the token grid of every sample in the row; everything else is derived from
it: lengths and cumulative offsets (cu_seqlens), the sample each token belongs to, positions for RoPE
that restart at every sample, and the attention segments that keep samples apart. The data loader
produces layouts; the model reads them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from vidforge.models.attention import Segments
from vidforge.models.patchify import Grid, patchify, token_grid, unpatchify


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
        return torch.repeat_interleave(
            torch.arange(self.num_samples, device=device), torch.tensor(self.seqlens, device=device)
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


# Context parallel: one rank's share of a token row -------------------------------------------------


@dataclass(frozen=True, eq=False)
class TokenShard:
    """Which tokens of a row one rank holds when the sequence is split over `size` context-parallel
    ranks. Pure host data (no process group): the model reads it, `vidforge.parallel.context_parallel`
    communicates with it.

    The split is per sample: sample i of n_i tokens is cut into `size` contiguous pieces of n_i // size
    or n_i // size + 1 tokens (the first n_i % size ranks take one more), and each rank's piece is
    padded at its end to c_i = ceil(n_i / size) tokens. A rank's tokens are its pieces of every sample,
    in sample order: `local` = sum c_i tokens on every rank, and every rank holds 1/size of every
    sample (to one token), so attention work (quadratic per sample) and loss tokens are balanced, not
    only token counts. A plain batch (`packed=False`, B rows of one grid) is the one-sample case applied
    to every row: rank r holds a contiguous slice of each row ([r S/size, (r+1) S/size), whole frames
    when T' divides by size: the ST-DiT hybrid's frames layout).

    Padding: under one token per sample and rank (size * c_i - n_i < size per sample). Pad tokens are
    zeros (`split`), sit at position (0, 0, 0) and belong to their sample (they modulate and
    cross-attend like it), are never keys in self-attention (context-parallel attention drops or masks
    them), and are excluded from the loss (`valid`). Their outputs are finite and meaningless.

    Orders: "row order" is the unpadded full row (what `pack_latents` or `patchify` give); "gathered
    order" is the ranks' local tokens concatenated by rank (what an all-gather over the cp group gives,
    size * local tokens); `gathered_row_index` maps between them.
    """

    layout: SequenceLayout
    rank: int
    size: int
    packed: bool = True
    _cache: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise ValueError(
                f"TokenShard: rank {self.rank} is outside a context-parallel group of {self.size}"
            )
        if not self.packed and self.layout.num_samples != 1:
            raise ValueError("TokenShard of a plain batch describes one grid (shared by every row)")

    @classmethod
    def of_layout(cls, layout: SequenceLayout, rank: int, size: int) -> TokenShard:
        """Rank `rank`'s share of one packed row (B = 1)."""
        return cls(layout, rank, size, packed=True)

    @classmethod
    def of_grid(cls, grid: Grid, rank: int, size: int) -> TokenShard:
        """Rank `rank`'s share of every row of a plain batch whose samples share the token grid `grid`."""
        return cls(SequenceLayout((tuple(grid),)), rank, size, packed=False)

    # Sizes (host integers) ---------------------------------------------------------------------------

    @property
    def grid(self) -> Grid:
        """The token grid of a plain batch's rows."""
        if self.packed:
            raise ValueError("a packed row has one grid per sample: see TokenShard.layout.grids")
        return self.layout.grids[0]

    @property
    def total(self) -> int:
        """Real tokens of the full row."""
        return self.layout.total

    @property
    def chunk_lens(self) -> tuple[int, ...]:
        """Tokens of each sample on every rank (pads included): c_i = ceil(n_i / size)."""
        return tuple(-(-n // self.size) for n in self.layout.seqlens)

    @property
    def padded_lens(self) -> tuple[int, ...]:
        """Each sample's length padded to a multiple of size: size * c_i."""
        return tuple(self.size * c for c in self.chunk_lens)

    @property
    def local(self) -> int:
        """Tokens every rank holds (pads included)."""
        return sum(self.chunk_lens)

    @property
    def pad(self) -> int:
        """Pad tokens in the whole row (over all ranks)."""
        return self.size * self.local - self.total

    @property
    def gathered_is_row_order(self) -> bool:
        """True when gathering the ranks' tokens gives the row itself (one sample per row, no pads), so
        `assemble` and `gathered_row_index` are the identity."""
        return self.layout.num_samples == 1 and self.pad == 0

    def local_counts(self, rank: int | None = None) -> tuple[int, ...]:
        """Real tokens of each sample on `rank` (default: this rank): n_i // size, plus one on the first
        n_i % size ranks."""
        r = self.rank if rank is None else rank
        return tuple(n // self.size + (r < n % self.size) for n in self.layout.seqlens)

    # Index tensors (cached per device) ---------------------------------------------------------------

    def _cached(self, key: tuple, build) -> torch.Tensor:
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]

    def row_index(self, device: torch.device | str = "cpu", rank: int | None = None) -> torch.Tensor:
        """(local,) position in the full row of each of `rank`'s tokens, -1 for a pad."""
        r = self.rank if rank is None else rank

        def build() -> torch.Tensor:
            parts = []
            for offset, n, c, count in zip(
                self.layout.offsets, self.layout.seqlens, self.chunk_lens, self.local_counts(r), strict=False
            ):
                start = offset + r * (n // self.size) + min(r, n % self.size)
                within = torch.arange(c)
                parts.append(torch.where(within < count, start + within, -1))
            return torch.cat(parts).to(device)

        return self._cached(("row", r, str(device)), build)

    def valid(self, device: torch.device | str = "cpu", rank: int | None = None) -> torch.Tensor:
        """(local,) bool: True for real tokens of `rank`, False for pads (mask the loss with it)."""
        r = self.rank if rank is None else rank
        return self._cached(("valid", r, str(device)), lambda: self.row_index(device, r) >= 0)

    def token_sample(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """(local,) sample of every local token (pads belong to the sample they pad); the same on every
        rank."""
        return self._cached(
            ("sample", str(device)),
            lambda: torch.repeat_interleave(
                torch.arange(self.layout.num_samples), torch.tensor(self.chunk_lens)
            ).to(device),
        )

    def positions(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """(local, 3) integer (t, h, w) positions of the local tokens; pads at (0, 0, 0)."""

        def build() -> torch.Tensor:
            index = self.row_index("cpu")
            full = self.layout.positions("cpu")
            return torch.where((index >= 0)[:, None], full[index.clamp(min=0)], 0).to(device)

        return self._cached(("positions", str(device)), build)

    def gathered_padded_order(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """(size * local,) the gathered positions of every rank's tokens, reordered sample by sample
        (sample i: rank 0's chunk, rank 1's, ...; size * c_i tokens, real ones in row order, pads
        among them). Index a gathered tensor with it to make each sample's tokens contiguous."""

        def build() -> torch.Tensor:
            parts, local_offset = [], 0
            for c in self.chunk_lens:
                ranks = torch.arange(self.size).repeat_interleave(c)
                within = torch.arange(c).repeat(self.size)
                parts.append(ranks * self.local + local_offset + within)
                local_offset += c
            return torch.cat(parts).to(device)

        return self._cached(("padded", str(device)), build)

    def gathered_row_index(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """(total,) for every real token in row order, its position in gathered order: the full row is
        `gathered.index_select(1, gathered_row_index)`."""

        def build() -> torch.Tensor:
            order = self.gathered_padded_order("cpu")
            gathered_valid = torch.cat([self.valid("cpu", r) for r in range(self.size)])
            return order[gathered_valid[order]].to(device)

        return self._cached(("gathered_row", str(device)), build)

    # Tensors -----------------------------------------------------------------------------------------

    def split(self, x: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """This rank's tokens of a full-row tensor (row order along `dim`): pads are zeros."""
        if x.shape[dim] != self.total:
            raise ValueError(
                f"TokenShard.split: the row has {self.total} tokens, the tensor {x.shape[dim]} along dim {dim}"
            )
        index = self.row_index(x.device)
        local = x.index_select(dim, index.clamp(min=0))
        shape = [1] * x.ndim
        shape[dim] = self.local
        return torch.where(
            self.valid(x.device).view(shape), local, torch.zeros((), dtype=x.dtype, device=x.device)
        )

    def assemble(self, gathered: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """The full row (row order, pads dropped) from every rank's tokens concatenated by rank along
        `dim` (size * local)."""
        if gathered.shape[dim] != self.size * self.local:
            raise ValueError(
                f"TokenShard.assemble expects {self.size} x {self.local} gathered tokens along dim {dim}, "
                f"got {gathered.shape[dim]}"
            )
        if self.gathered_is_row_order:
            return gathered
        return gathered.index_select(dim, self.gathered_row_index(gathered.device))
