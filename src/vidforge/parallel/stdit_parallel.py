"""ST-DiT sequence parallel: the token sequence split over the context-parallel ranks by whole frames,
and switched by all-to-all to a split by (h, w) positions for temporal attention (NeMo's ST-DiT hybrid,
section 4.6; ScaleFusion's inference schedule in `scalefusion.py` overlaps the same switches).

Two layouts of a sample with token grid (T, H, W) over P ranks (T and H*W divisible by P):

- frames ("spatial layout"): rank r holds frames [r T/P, (r+1) T/P) at every position, t-major: the
  contiguous chunk of the sample that context parallel's `TokenShard` gives each rank. Spatial
  attention (within a frame) is local here.
- positions ("temporal layout"): rank r holds the flattened positions [r HW/P, (r+1) HW/P) of every
  frame, t-major. Temporal attention (across frames at one position) is local here.

Training (`apply_st_hybrid`, parallel.cp_impl=st-hybrid): the model runs on its `TokenShard` as under
any context parallel (`model(shard.split(tokens), ..., shard=shard)`, see `context_parallel`), and every
self-attention's `Attend` is replaced by `STHybridAttend`, which reads the scope of the `ContextShard`
mask: spatial attention runs locally on the rank's frames; temporal attention moves q, k and v to the
positions layout with one all-to-all, attends, and moves the output back with a second; full attention
(the parallel ST-DiT block's third branch) runs the context-parallel full-attention implementation
(all-gather of K/V by default). So a sequential ST-DiT block costs two all-to-alls, before and after
its temporal attention; everything per token (modulation, norms, cross-attention, MLP) stays in the
frames layout. Plain batches and packed rows (every sample's T and H*W divisible by P) both work; the
all-to-alls are autograd-aware functional collectives. For images and odd frame counts, which cannot be
split by frames, `st_spatial.py` slices by positions instead (parallel.cp_impl=st-spatial).

Inference (`scalefusion.py`) switches the hidden states instead (one all-to-all of width C rather than
q, k, v), keeping the positions layout through cross-attention and MLP; `STShards`,
`spatial_sublayer` and `temporal_sublayers` below are its pieces (the sequential block cut at the
switch; the distributed tests hold them to the unmodified block's output).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from vidforge.attention.dispatch import Attend, AttentionMask
from vidforge.errors import UserInputError
from vidforge.models.layers import Conditioning, SelfAttention, modulate
from vidforge.models.scopes import Scope, batch_scopes, packed_scopes
from vidforge.parallel.context_parallel import ContextParallelAttend, CpGroup, cp_process_group
from vidforge.profile.model import Model
from vidforge.tokens import ContextShard, Grid, SequenceLayout, TokenShard


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
                f"ST-DiT sequence parallel splits frames and positions over {self.world} ranks, but the "
                f"token grid is {t} x {h} x {w} (T={t}, H*W={h * w}); pick frames and a size whose token "
                f"counts divide by {self.world}, or use fewer ranks"
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
        raise UserInputError(
            f"{what} splits ST-DiT's spatial and temporal attention; model.architecture is "
            f"{config.architecture!r}: use parallel.cp_impl all-gather, ring or ulysses for a DiT"
        )


# --- training: the hybrid as a context-parallel Attend ------------------------------------------------


@dataclass(frozen=True, eq=False)
class _HybridPlan:
    """Index maps and attention scopes of one shard, host-built once per (row shape, rank).

    `send` orders this rank's frames-layout tokens as [to rank r][sample i][local frame t][r's
    position n] so that an equal-split all-to-all delivers each rank its positions; `recv` orders what
    arrives ([from rank q][sample i][q's frame t][my position n]) into the positions layout (sample by
    sample, (T_i, H_i W_i / P) t-major). The way back uses their inverses."""

    send: torch.Tensor
    recv: torch.Tensor
    send_back: torch.Tensor
    recv_back: torch.Tensor
    frames_scope: Scope
    positions_scope: Scope


def _check_divisible(grids: tuple[Grid, ...], size: int) -> None:
    for i, (t, h, w) in enumerate(grids):
        if t % size or (h * w) % size:
            raise UserInputError(
                f"parallel.cp_impl=st-hybrid splits every sample's frames and positions over cp={size} ranks, "
                f"but sample {i} has a {t} x {h} x {w} token grid (T={t}, H*W={h * w}); use frame counts and sizes "
                f"whose token counts divide by {size} (data buckets, infer.frames), or another parallel.cp_impl"
            )


@functools.lru_cache(maxsize=64)
def _hybrid_plan(grids: tuple[Grid, ...], packed: bool, size: int, batch: int, device: str) -> _HybridPlan:
    _check_divisible(grids, size)
    sizes = [(h * w, t // size, h * w // size) for t, h, w in grids]
    chunk = sum(tl * nl for _, tl, nl in sizes)  # tokens this rank sends to each rank
    send, recv = [], []
    for r in range(size):
        offset = 0
        for hw, tl, nl in sizes:
            cell = torch.arange(tl)[:, None] * hw + r * nl + torch.arange(nl)[None, :]
            send.append(offset + cell.reshape(-1))
            offset += tl * hw
    chunk_offset = 0
    for _, tl, nl in sizes:
        cell = torch.arange(size)[:, None, None] * chunk + torch.arange(tl)[None, :, None] * nl
        recv.append((chunk_offset + cell + torch.arange(nl)[None, None, :]).reshape(-1))
        chunk_offset += tl * nl
    send_index, recv_index = torch.cat(send), torch.cat(recv)
    frame_grids = tuple((t // size, h, w) for t, h, w in grids)
    position_grids = tuple((t, 1, h * w // size) for t, h, w in grids)
    if packed:
        frames_scope = packed_scopes(SequenceLayout(frame_grids), device)["spatial"]
        positions_scope = packed_scopes(SequenceLayout(position_grids), device)["temporal"]
    else:
        frames_scope = batch_scopes(batch, frame_grids[0])["spatial"]
        positions_scope = batch_scopes(batch, position_grids[0])["temporal"]
    return _HybridPlan(
        send_index.to(device),
        recv_index.to(device),
        torch.argsort(recv_index).to(device),
        torch.argsort(send_index).to(device),
        frames_scope,
        positions_scope,
    )


def attend_in(scope: Scope, inner: Attend, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """`inner` attention over q, k, v (B, S, H, D) regrouped as `scope` says, the output scattered back."""
    return scope.scatter(inner(scope.gather(q), scope.gather(k), scope.gather(v), scope.mask))


def _exchange(x: torch.Tensor, order: torch.Tensor, arrival: torch.Tensor, group, size: int) -> torch.Tensor:
    """Reorder tokens (dim 1) by `order` into [destination rank][...] chunks, all-to-all them, and
    reorder what arrives ([source rank][...]) by `arrival`."""
    send = x.index_select(1, order).unflatten(1, (size, -1)).movedim(1, 0)  # (P, B, chunk, ...)
    recv = _a2a(send, group).movedim(0, 1).flatten(1, 2)
    return recv.index_select(1, arrival)


class STHybridAttend(ContextParallelAttend):
    """A self-attention's `Attend` under parallel.cp_impl=st-hybrid: spatial attention on the rank's own
    frames, temporal attention in the positions layout between two all-to-alls, full attention by the
    context-parallel `full_impl`. Without a `ContextShard` mask it runs the wrapped `Attend` unchanged."""

    IMPL = "st-hybrid"

    def __init__(self, inner: Attend, group: dist.ProcessGroup, full_impl: str = "all-gather") -> None:
        super().__init__(inner, group, full_impl)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask = None):
        if not isinstance(mask, ContextShard) or mask.scope == "full":
            return super().forward(q, k, v, mask)
        shard: TokenShard = mask.shard
        size = dist.get_world_size(self.group)
        if shard.size != size or shard.rank != dist.get_rank(self.group):
            raise ValueError(
                f"the TokenShard is rank {shard.rank} of {shard.size}, but this process is rank "
                f"{dist.get_rank(self.group)} of a cp group of {size}: make the shard with shard_of(..., cp_mesh)"
            )
        plan = _hybrid_plan(shard.layout.grids, shard.packed, size, q.shape[0], str(q.device))
        if mask.scope == "spatial":
            return attend_in(plan.frames_scope, self.inner, q, k, v)
        qkv = _exchange(torch.stack([q, k, v], dim=2), plan.send, plan.recv, self.group, size)
        out = attend_in(plan.positions_scope, self.inner, *qkv.unbind(2))
        return _exchange(out, plan.send_back, plan.recv_back, self.group, size)

    def extra_repr(self) -> str:
        return f"st-hybrid, full={self.impl}, cp={dist.get_world_size(self.group)}"


def apply_st_hybrid(model: nn.Module, cp_mesh: CpGroup, full_impl: str = "all-gather") -> nn.Module:
    """parallel.cp_impl=st-hybrid: install `STHybridAttend` in every self-attention layer of an ST-DiT
    (in place; returns the model). `full_impl` (all-gather, ring or ulysses) serves the parallel
    block's full-attention branch. Then run the model on its `TokenShard` exactly as under
    `apply_cp` (`shard_of`, `shard.split`, `model(..., shard=shard)`, `shard_loss`, `gather_row`).
    Only swaps parameter-free modules, so it composes with tensor parallel, checkpointing and FSDP in
    any order. Idempotent."""
    group = cp_process_group(cp_mesh)
    return install_st_attend(model, STHybridAttend, lambda inner: STHybridAttend(inner, group, full_impl))


def install_st_attend(
    model: nn.Module, kind: type[ContextParallelAttend], make: Callable[[Attend], ContextParallelAttend]
) -> nn.Module:
    """Put `make(inner)` (an ST-DiT sequence-parallel Attend of class `kind`) in every self-attention
    layer of an ST-DiT, in place of its `Attend` (or of another context-parallel one's inner `Attend`);
    layers that already hold a `kind` are left. Returns the model."""
    what = f"parallel.cp_impl={kind.IMPL}"
    config = getattr(model, "config", None)
    if config is not None:
        check_stdit(config, what)
    replaced = 0
    for module in model.modules():
        if isinstance(module, SelfAttention):
            inner = module.attend
            if isinstance(inner, kind):
                continue
            if isinstance(inner, ContextParallelAttend):
                inner = inner.inner
            module.attend = make(inner)
            replaced += 1
    if not replaced and not any(isinstance(m, kind) for m in model.modules()):
        raise ValueError(f"{what} found no self-attention layer to make context-parallel")
    return model
