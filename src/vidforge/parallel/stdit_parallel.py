"""ST-DiT sequence parallel: the token sequence split over the context-parallel ranks by whole frames,
and switched by all-to-all to a split by (h, w) positions for temporal attention (NeMo's ST-DiT hybrid,
section 4.6; the layouts ScaleFusion's inference schedule overlaps in `scalefusion.py`).

Two layouts of a plain batch with token grid (T, H, W) over P ranks (T and H*W divisible by P):

- frames ("spatial layout"): rank r holds frames [r T/P, (r+1) T/P) at every position, (B, T/P*H*W, C)
  in t-major order: the contiguous shard of the token row that context parallel gives each rank.
  Spatial attention (within a frame) is local here.
- positions ("temporal layout"): rank r holds the flattened positions [r HW/P, (r+1) HW/P) of every
  frame, (B, T*HW/P, C), t-major. Temporal attention (across frames at one position) is local here.

`frames_to_positions` and `positions_to_frames` are one all-to-all each (autograd-aware functional
collectives, so training backpropagates through them). Everything per token (modulation, norms,
cross-attention, MLP, the final layer) runs in whichever layout the tokens are in. A sequential ST-DiT
block therefore costs two all-to-alls: its spatial attention runs in the frames layout, one all-to-all
switches to positions for temporal attention, cross-attention and MLP, and the next block's spatial
attention switches back. The parallel block (spatial + temporal + full attention of one input) switches
its normalised input to positions and the temporal branch's output back, and runs its full attention
branch with K/V gathered from every rank.

The block wrappers are applied from outside (`apply_st_hybrid`): they reach into the block's sub-layers
by name and recompose the block's forward around the layout switches (`spatial_sublayer` and
`temporal_sublayers` below are STDiTBlock.forward cut at the switch; the distributed tests hold them to
the unmodified block's output).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from vidforge.models.layers import Conditioning, modulate
from vidforge.models.packing import grid_positions
from vidforge.models.patchify import Grid
from vidforge.models.rope import rope_tables
from vidforge.models.scopes import Scope, batch_scopes
from vidforge.profile.model import Model


def _a2a(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """all_to_all_single over dim 0 (equal splits), differentiable (its backward is the reverse
    all-to-all)."""
    from torch.distributed._functional_collectives import all_to_all_single_autograd, wait_tensor

    return wait_tensor(all_to_all_single_autograd(x.contiguous(), None, None, group))


@dataclass(frozen=True)
class STShards:
    """Which tokens of a plain batch's grid (T, H, W) rank `rank` of `world` holds in each layout."""

    grid: Grid
    rank: int
    world: int

    def __post_init__(self) -> None:
        t, h, w = self.grid
        if t % self.world or (h * w) % self.world:
            raise ValueError(
                f"parallel.cp_impl=st-hybrid splits frames and positions over cp={self.world} ranks, but the "
                f"token grid is {t} x {h} x {w} (T={t}, H*W={h * w}); pick frames and a size whose token "
                f"counts divide by {self.world}, or change parallel.cp"
            )
        if not 0 <= self.rank < self.world:
            raise ValueError(f"rank {self.rank} is outside a group of {self.world}")

    @property
    def frames(self) -> int:
        """Frames per rank in the frames layout."""
        return self.grid[0] // self.world

    @property
    def positions(self) -> int:
        """Flattened (h, w) positions per rank in the positions layout."""
        return self.grid[1] * self.grid[2] // self.world

    @property
    def hw(self) -> int:
        return self.grid[1] * self.grid[2]

    @property
    def frame_range(self) -> tuple[int, int]:
        """This rank's frames [start, end) in the whole clip."""
        return self.rank * self.frames, (self.rank + 1) * self.frames

    @property
    def token_range(self) -> tuple[int, int]:
        """This rank's tokens [start, end) of the full t-major row in the frames layout."""
        start, end = self.frame_range
        return start * self.hw, end * self.hw

    # --- token indices, for RoPE tables and positions of a slice of a layout ---------------------------

    def frame_token_index(self, first: int = 0, count: int | None = None) -> torch.Tensor:
        """Full-row indices of local frames [first, first+count) in the frames layout."""
        count = self.frames - first if count is None else count
        start = (self.frame_range[0] + first) * self.hw
        return torch.arange(start, start + count * self.hw)

    def position_token_index(self, first: int = 0, count: int | None = None) -> torch.Tensor:
        """Full-row indices of local positions [first, first+count) at every frame (positions layout,
        t-major: (T, count) flattened)."""
        count = self.positions - first if count is None else count
        t = self.grid[0]
        columns = self.rank * self.positions + first + torch.arange(count)
        return (torch.arange(t)[:, None] * self.hw + columns[None, :]).reshape(-1)

    def frame_scope(self, batch: int, count: int | None = None) -> Scope:
        """Spatial attention over `count` whole frames held in the frames layout."""
        return batch_scopes(batch, (self.frames if count is None else count, *self.grid[1:]))["spatial"]

    def position_scope(self, batch: int, count: int | None = None) -> Scope:
        """Temporal attention over `count` positions held (T, count) in the positions layout: a grid of
        T x 1 x count regroups them exactly as the full grid's temporal scope does."""
        return batch_scopes(batch, (self.grid[0], 1, self.positions if count is None else count))["temporal"]

    # --- the two all-to-alls ----------------------------------------------------------------------------

    def frames_to_positions(self, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        """(B, T/P * HW, C) frames layout -> (B, T * HW/P, C) positions layout."""
        b, _, c = x.shape
        p, tl, nl = self.world, self.frames, self.positions
        send = x.reshape(b, tl, p, nl, c).permute(2, 0, 1, 3, 4)  # to rank r: its positions, my frames
        recv = _a2a(send, group)  # (P, B, T/P, HW/P, C): from rank q, q's frames
        return recv.permute(1, 0, 2, 3, 4).reshape(b, p * tl * nl, c)

    def positions_to_frames(self, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        """(B, T * HW/P, C) positions layout -> (B, T/P * HW, C) frames layout."""
        b, _, c = x.shape
        p, tl, nl = self.world, self.frames, self.positions
        send = x.reshape(b, p, tl, nl, c).transpose(0, 1)  # to rank q: q's frames, my positions
        recv = _a2a(send, group)  # (P, B, T/P, HW/P, C): from rank r, r's positions
        return recv.permute(1, 2, 0, 3, 4).reshape(b, tl * p * nl, c)


def layout_rope(
    config: Model, grid: Grid, index: torch.Tensor, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE tables for the tokens `index` of the full grid's t-major row; elementwise the rows the
    single-process model's `condition` computes for them."""
    positions = grid_positions(grid, device)[index.to(device)]
    return rope_tables(positions, config.head_dim, config.rope_theta, dtype)


def rope_dtype(model: nn.Module) -> torch.dtype:
    """The table dtype `DiT.condition` uses: float64 for a float64 model, else float32."""
    return torch.float64 if model.param_dtype == torch.float64 else torch.float32


# --- the sequential ST-DiT block, cut at the layout switch ---------------------------------------------


def spatial_sublayer(block: nn.Module, x: torch.Tensor, mods, rope, scope: Scope) -> torch.Tensor:
    """STDiTBlock's first sub-layer (spatial attention) on tokens of whole frames."""
    sh1, sc1, g1 = mods[0:3]
    return x + g1 * block.spatial_attn(modulate(block.norm1(x), sh1, sc1), rope, scope)


def temporal_sublayers(
    block: nn.Module, x: torch.Tensor, mods, rope, scope: Scope, cond: Conditioning
) -> torch.Tensor:
    """STDiTBlock's temporal attention, cross-attention and MLP on tokens of whole positions."""
    sh2, sc2, g2, sh3, sc3, g3, sh4, sc4, g4 = mods[3:12]
    x = x + g2 * block.temporal_attn(modulate(block.norm2(x), sh2, sc2), rope, scope)
    x = x + g3 * block.cross_attn(modulate(block.norm3(x), sh3, sc3), cond.text, cond.text_mask)
    return x + g4 * block.mlp(modulate(block.norm4(x), sh4, sc4))


def check_stdit(config: Model, what: str) -> None:
    if config.architecture != "stdit":
        raise ValueError(
            f"{what} splits ST-DiT's spatial and temporal attention; model.architecture is "
            f"{config.architecture!r}: use parallel.cp_impl all-gather, ring or ulysses for a DiT"
        )
