"""Context parallel's host-side data: which tokens of a row one rank holds (`TokenShard`), and attention
over such a split row (`ContextShard`, a mask only a context-parallel attention understands). No process
group here: the model reads these, `vidforge.parallel` communicates with them."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from vidforge.token_grid import Grid
from vidforge.tokens.layout import SequenceLayout

SLICINGS = ("chunks", "positions")
"""How `TokenShard` cuts each sample: contiguous t-major chunks, or (h, w) position columns."""


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

    Slicings (`slicing`): "chunks", the above; "positions" (ST-DiT sequence parallel sliced by space,
    parallel.cp_impl=st-spatial): rank r holds the flattened (h, w) positions [s_r, s_r + m_r) of every
    frame of sample i (m_r = hw_i // size, plus one on the first hw_i % size ranks), t-major as a
    (T_i, q_i) grid with q_i = ceil(hw_i / size) columns, the last q_i - m_r of them pads. So each rank
    holds whole position columns (temporal attention is local) and c_i = T_i q_i tokens; a sample's
    pads are T_i (size q_i - hw_i), none when size divides H_i W_i. Pads as above.

    Orders: "row order" is the unpadded full row (what `pack_latents` or `patchify` give); "gathered
    order" is the ranks' local tokens concatenated by rank (what an all-gather over the cp group gives,
    size * local tokens); `gathered_row_index` maps between them.
    """

    layout: SequenceLayout
    rank: int
    size: int
    packed: bool = True
    slicing: str = "chunks"
    _cache: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise ValueError(
                f"TokenShard: rank {self.rank} is outside a context-parallel group of {self.size}"
            )
        if not self.packed and self.layout.num_samples != 1:
            raise ValueError("TokenShard of a plain batch describes one grid (shared by every row)")
        if self.slicing not in SLICINGS:
            raise ValueError(f"TokenShard.slicing must be one of {', '.join(SLICINGS)}, got {self.slicing!r}")

    @classmethod
    def of_layout(cls, layout: SequenceLayout, rank: int, size: int, slicing: str = "chunks") -> TokenShard:
        """Rank `rank`'s share of one packed row (B = 1)."""
        return cls(layout, rank, size, packed=True, slicing=slicing)

    @classmethod
    def of_grid(cls, grid: Grid, rank: int, size: int, slicing: str = "chunks") -> TokenShard:
        """Rank `rank`'s share of every row of a plain batch whose samples share the token grid `grid`."""
        return cls(SequenceLayout((tuple(grid),)), rank, size, packed=False, slicing=slicing)

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
        """Tokens of each sample on every rank (pads included): c_i = ceil(n_i / size), or T_i q_i for
        the positions slicing."""
        if self.slicing == "positions":
            return tuple(t * q for (t, _, _), q in zip(self.layout.grids, self.columns, strict=True))
        return tuple(-(-n // self.size) for n in self.layout.seqlens)

    @property
    def columns(self) -> tuple[int, ...]:
        """Positions slicing: the position columns of each sample on every rank, q_i = ceil(H_i W_i / size)
        (pads included)."""
        return tuple(-(-(h * w) // self.size) for _, h, w in self.layout.grids)

    @property
    def local_grids(self) -> tuple[Grid, ...]:
        """Positions slicing: each sample's local tokens as the t-major grid (T_i, 1, q_i), so that the
        grid's temporal scope is the sample's temporal attention (pad columns attend among themselves)."""
        if self.slicing != "positions":
            raise ValueError(
                "TokenShard.local_grids: only the positions slicing holds whole position columns"
            )
        return tuple((t, 1, q) for (t, _, _), q in zip(self.layout.grids, self.columns, strict=True))

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
        """True when gathering the ranks' tokens gives the row itself (one sample per row, no pads, and
        contiguous pieces: the chunks slicing, or positions of a single frame), so `assemble` and
        `gathered_row_index` are the identity."""
        contiguous = self.slicing == "chunks" or self.layout.grids[0][0] == 1
        return self.layout.num_samples == 1 and self.pad == 0 and contiguous

    def local_counts(self, rank: int | None = None) -> tuple[int, ...]:
        """Real tokens of each sample on `rank` (default: this rank): n_i // size, plus one on the first
        n_i % size ranks (positions slicing: T_i times its position count m_r)."""
        r = self.rank if rank is None else rank
        if self.slicing == "positions":
            return tuple(t * _share(h * w, self.size, r)[1] for t, h, w in self.layout.grids)
        return tuple(_share(n, self.size, r)[1] for n in self.layout.seqlens)

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
            if self.slicing == "positions":
                for offset, (t, h, w), q in zip(
                    self.layout.offsets, self.layout.grids, self.columns, strict=False
                ):
                    start, count = _share(h * w, self.size, r)
                    column = torch.arange(q)
                    index = offset + torch.arange(t)[:, None] * (h * w) + start + column[None, :]
                    parts.append(torch.where(column[None, :] < count, index, -1).reshape(-1))
                return torch.cat(parts).to(device)
            for offset, n, c in zip(self.layout.offsets, self.layout.seqlens, self.chunk_lens, strict=False):
                start, count = _share(n, self.size, r)
                within = torch.arange(c)
                parts.append(torch.where(within < count, offset + start + within, -1))
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
        (sample i: rank 0's chunk, rank 1's, ...; size * c_i tokens, pads among them; the real ones in
        row order for the chunks slicing). Index a gathered tensor with it to make each sample's tokens
        contiguous."""

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
            rows = torch.cat([self.row_index("cpu", r) for r in range(self.size)])  # of each gathered token
            real = torch.nonzero(rows >= 0).squeeze(1)
            return torch.empty(self.total, dtype=torch.long).index_copy_(0, rows[real], real).to(device)

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


def _share(n: int, size: int, rank: int) -> tuple[int, int]:
    """Rank `rank`'s contiguous piece [start, start + count) of n items split over `size` ranks, the
    first n % size ranks taking one more."""
    return rank * (n // size) + min(rank, n % size), n // size + (rank < n % size)


@dataclass(eq=False)
class ContextShard:
    """Attention over a token row split across context-parallel ranks (`TokenShard`): q, k and v hold
    this rank's tokens (B, shard.local, H, D) and `scope` names the pattern ("full": every token of a
    sample attends to every real token of that sample, on all ranks; "spatial"/"temporal" for ST-DiT).
    Keys live on other ranks, so only a context-parallel `Attend` replacement can evaluate it: see
    `vidforge.parallel.context_parallel.apply_cp`."""

    scope: str
    shard: TokenShard

    def __post_init__(self) -> None:
        if self.scope not in ("full", "spatial", "temporal"):
            raise ValueError(f"ContextShard.scope must be full, spatial or temporal, got {self.scope!r}")
