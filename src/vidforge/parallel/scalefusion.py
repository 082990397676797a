"""ScaleFusion's overlapped ST-DiT inference schedule (Yang et al., MLSys 2025, "ScaleFusion: scalable
inference of spatial-temporal diffusion transformers for high-resolution long video generation").

The sequence is split over P ranks as in `stdit_parallel`: spatial attention runs with each rank holding
whole frames, temporal attention (with cross-attention and MLP, which are per token) with each rank
holding whole (h, w) positions, and an all-to-all switches between the two layouts. Done plainly, every
all-to-all waits for the whole layer before it and the whole next layer waits for it. ScaleFusion cuts
the work into slices that the all-to-alls can run beside:

- the spatial phase of a block (frames layout) runs in `slices_t` slices of this rank's frames (N_T);
- the temporal phase (positions layout) runs in `slices_s` slices of this rank's positions (N_S);
- the all-to-all into the temporal phase is cut by the temporal phase's slices: the data of position
  slice j is one asynchronous all-to-all, so slice j+1's data travels while slice j computes. The first
  slice's all-to-all would still wait for the whole spatial phase, so it is cut further, along the
  spatial phase's frame slices, into `first_parts_s` parts (L_S): each part leaves as soon as the frames
  it carries are computed, beside the rest of the spatial phase;
- symmetrically, the all-to-all back into the next spatial phase is cut by that phase's frame slices, and
  its first slice's all-to-all into `first_parts_t` parts (L_T) along the temporal phase's position
  slices, each leaving as soon as its positions are computed.

Every token goes through the same arithmetic as in the plain schedule (slices 1, 1, 1, 1), only in
smaller batches, and every collective is an exact copy, so the result equals the plain schedule's up to
float rounding of the smaller matrix products (the tests measure bitwise equality on CPU float64).
Communication uses torch.distributed's asynchronous all_to_all_single (async_op=True, waited on before
use); inference only (no autograd). Plain batches of the sequential ST-DiT block.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from vidforge.models.rope import sincos_position_embedding
from vidforge.parallel.stdit_parallel import STShards, check_stdit, spatial_sublayer, temporal_sublayers
from vidforge.tokens import patchify, token_grid, unpatchify


@dataclass(frozen=True)
class ScaleFusionSlicing:
    """N_T, N_S, L_T, L_S (see the module docstring). The profile fields, once added, are
    infer.scalefusion_slices_t / _slices_s / _first_parts_t / _first_parts_s with these defaults.
    Counts larger than what a rank holds are clamped (2 local frames cannot make 4 slices)."""

    slices_t: int = 4
    slices_s: int = 4
    first_parts_t: int = 1
    first_parts_s: int = 3

    def __post_init__(self) -> None:
        for name in ("slices_t", "slices_s", "first_parts_t", "first_parts_s"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"infer.scalefusion_{name}: must be an integer >= 1, got {value!r}")
        if self.first_parts_t > self.slices_s:
            raise ValueError(
                f"infer.scalefusion_first_parts_t={self.first_parts_t}: the first frame slice's all-to-all is cut "
                f"along the {self.slices_s} position slices (infer.scalefusion_slices_s); use at most that many parts"
            )
        if self.first_parts_s > self.slices_t:
            raise ValueError(
                f"infer.scalefusion_first_parts_s={self.first_parts_s}: the first position slice's all-to-all is cut "
                f"along the {self.slices_t} frame slices (infer.scalefusion_slices_t); use at most that many parts"
            )


PLAIN = ScaleFusionSlicing(1, 1, 1, 1)
"""The plain schedule: one synchronous all-to-all per layout switch, each phase in one piece."""


def even_splits(size: int, parts: int) -> list[tuple[int, int]]:
    """[start, count) ranges cutting range(size) into min(parts, size) nearly equal contiguous pieces."""
    parts = max(1, min(parts, size))
    base, extra = divmod(size, parts)
    out, start = [], 0
    for i in range(parts):
        count = base + (1 if i < extra else 0)
        out.append((start, count))
        start += count
    return out


class _Exchange:
    """One asynchronous all_to_all_single in flight: keeps its send buffer alive until it is waited on."""

    def __init__(self, send: torch.Tensor, group: dist.ProcessGroup) -> None:
        self.send = send.contiguous()
        self.recv = torch.empty_like(self.send)
        self.work = dist.all_to_all_single(self.recv, self.send, group=group, async_op=True)

    def result(self) -> torch.Tensor:
        self.work.wait()
        self.send = None
        return self.recv


def _groups(slices: list[tuple[int, int]], parts: int) -> list[tuple[int, int, int]]:
    """Consecutive slices merged into `parts` groups: (index of the group's last slice, start, count)."""
    out = []
    for first, count in even_splits(len(slices), parts):
        last = first + count - 1
        start = slices[first][0]
        out.append((last, start, slices[last][0] + slices[last][1] - start))
    return out


class ScaleFusionSchedule:
    """The overlapped forward of one model over one token grid on one rank of `group`."""

    def __init__(
        self, model: nn.Module, shards: STShards, group: dist.ProcessGroup, slicing: ScaleFusionSlicing
    ):
        self.model, self.shards, self.group = model, shards, group
        self.frame_slices = even_splits(shards.frames, slicing.slices_t)
        self.position_slices = even_splits(shards.positions, slicing.slices_s)
        # first_parts_s cuts the all-to-all into position slice 0 along the frame slices, and
        # first_parts_t the one into frame slice 0 along the position slices.
        self.into_positions_parts = _groups(self.frame_slices, slicing.first_parts_s)
        self.into_frames_parts = _groups(self.position_slices, slicing.first_parts_t)

    # --- layout switch: frames -> positions (feeds the temporal phase) ---------------------------------

    def _send_positions(
        self, x: torch.Tensor, frames: tuple[int, int], positions: tuple[int, int]
    ) -> _Exchange:
        """From the frames layout x (B, T/P, HW, C): to every rank r, frames [f, f+m) of this rank at r's
        positions [c, c+n); arrives as (P, B, m, n, C) ordered by source rank."""
        (f, m), (c, n) = frames, positions
        b, _, _, ch = x.shape
        p, nl = self.shards.world, self.shards.positions
        send = x[:, f : f + m].reshape(b, m, p, nl, ch)[:, :, :, c : c + n].permute(2, 0, 1, 3, 4)
        return _Exchange(send, self.group)

    def _positions_input(self, pieces: list[torch.Tensor]) -> torch.Tensor:
        """Received pieces (P, B, m_l, n, C), in frame order -> (B, T*n, C) positions-layout tokens."""
        recv = torch.cat(pieces, dim=2) if len(pieces) > 1 else pieces[0]  # (P, B, T/P, n, C)
        p, b, tl, n, ch = recv.shape
        return recv.permute(1, 0, 2, 3, 4).reshape(b, p * tl * n, ch)

    # --- layout switch: positions -> frames (feeds the next spatial phase) -----------------------------

    def _send_frames(self, y: torch.Tensor, frames: tuple[int, int], positions: tuple[int, int]) -> _Exchange:
        """From the positions layout y (B, T, HW/P, C): to every rank q, q's local frames [f, f+m) at this
        rank's positions [c, c+n); arrives as (P, B, m, n, C) ordered by source rank."""
        (f, m), (c, n) = frames, positions
        b, _, _, ch = y.shape
        p, tl = self.shards.world, self.shards.frames
        send = y.reshape(b, p, tl, -1, ch)[:, :, f : f + m, c : c + n].transpose(0, 1)
        return _Exchange(send, self.group)

    def _frames_input(self, pieces: list[torch.Tensor]) -> torch.Tensor:
        """Received pieces (P, B, m, n_l, C), in position order -> (B, m*HW, C) frames-layout tokens."""
        recv = torch.cat(pieces, dim=3) if len(pieces) > 1 else pieces[0]  # (P, B, m, HW/P, C)
        p, b, m, nl, ch = recv.shape
        return recv.permute(1, 2, 0, 3, 4).reshape(b, m * p * nl, ch)

    # --- one block ----------------------------------------------------------------------------------------

    def spatial_phase(self, block, mods, frames_in: list[Callable[[], torch.Tensor]], ropes, scopes):
        """Spatial attention slice by slice (frame slice i's input from frames_in[i]()); launches the
        all-to-all parts of position slice 0 as their frames complete, then the other position slices'
        all-to-alls. Returns, per position slice, a callable giving its positions-layout input."""
        b, ch = self.batch, self.model.config.hidden
        out = torch.empty(b, self.shards.frames, self.shards.hw, ch, dtype=self.dtype, device=self.device)
        first = self.position_slices[0]
        parts: list[_Exchange] = []
        groups = iter(self.into_positions_parts)
        group_last, group_start, group_count = next(groups)
        for i, (f, m) in enumerate(self.frame_slices):
            x = frames_in[i]()
            out[:, f : f + m] = spatial_sublayer(block, x, mods, ropes[i], scopes[i]).view(b, m, -1, ch)
            if i == group_last:
                parts.append(self._send_positions(out, (group_start, group_count), first))
                group_last, group_start, group_count = next(groups, (None, 0, 0))
        rest = [self._send_positions(out, (0, self.shards.frames), s) for s in self.position_slices[1:]]
        inputs = [lambda: self._positions_input([e.result() for e in parts])]
        inputs += [lambda e=e: self._positions_input([e.result()]) for e in rest]
        return inputs

    def temporal_phase(
        self, block, mods, positions_in, ropes, scopes, cond, send_back: bool = True
    ) -> tuple[torch.Tensor, list]:
        """Temporal attention, cross-attention and MLP slice by slice; launches the all-to-all parts of
        the next spatial phase's frame slice 0 as their positions complete, then the other frame slices'.
        Returns the positions-layout output (B, T, HW/P, C) and per frame slice its input callable
        (none when `send_back` is False: the last block's output stays in the positions layout)."""
        b, ch, t = self.batch, self.model.config.hidden, self.shards.grid[0]
        out = torch.empty(b, t, self.shards.positions, ch, dtype=self.dtype, device=self.device)
        first = self.frame_slices[0]
        parts: list[_Exchange] = []
        groups = iter(self.into_frames_parts)
        group_last, group_start, group_count = next(groups)
        for j, (c, n) in enumerate(self.position_slices):
            y = positions_in[j]()
            out[:, :, c : c + n] = temporal_sublayers(block, y, mods, ropes[j], scopes[j], cond).view(
                b, t, n, ch
            )
            if send_back and j == group_last:
                parts.append(self._send_frames(out, first, (group_start, group_count)))
                group_last, group_start, group_count = next(groups, (None, 0, 0))
        if not send_back:
            return out, []
        rest = [self._send_frames(out, s, (0, self.shards.positions)) for s in self.frame_slices[1:]]
        inputs = [lambda: self._frames_input([e.result() for e in parts])]
        inputs += [lambda e=e: self._frames_input([e.result()]) for e in rest]
        return out, inputs

    # --- the whole model ----------------------------------------------------------------------------------

    def forward(self, tokens: torch.Tensor, cond) -> torch.Tensor:
        """Full token row (B, S, patch_dim) -> full output (B, S, patch_dim), on every rank."""
        model, shards = self.model, self.shards
        cfg = model.config
        self.batch, self.device, self.dtype = tokens.shape[0], tokens.device, model.param_dtype
        cos, sin = cond.rope
        frame_ropes, frame_scopes = [], []
        for f, m in self.frame_slices:
            index = shards.frame_token_index(f, m).to(self.device)
            frame_ropes.append((cos[index], sin[index]))
            frame_scopes.append(shards.frame_scope(self.batch, m))
        position_ropes, position_scopes = [], []
        for c, n in self.position_slices:
            index = shards.position_token_index(c, n).to(self.device)
            position_ropes.append((cos[index], sin[index]))
            position_scopes.append(shards.position_scope(self.batch, n))

        lo, hi = shards.token_range
        h = model.patch_embed(tokens[:, lo:hi])
        if cfg.abs_position == "sincos":
            h = h + sincos_position_embedding(cond.positions[lo:hi], cfg.hidden, h.dtype)
        h = h.view(self.batch, shards.frames, shards.hw, -1)
        frames_in = [
            lambda f=f, m=m: h[:, f : f + m].reshape(self.batch, -1, h.shape[-1])
            for f, m in self.frame_slices
        ]
        blocks = list(model.blocks.values())
        for k, block in enumerate(blocks):
            mods = block.modulation(cond)
            positions_in = self.spatial_phase(block, mods, frames_in, frame_ropes, frame_scopes)
            last = k + 1 == len(blocks)
            y, frames_in = self.temporal_phase(
                block, mods, positions_in, position_ropes, position_scopes, cond, send_back=not last
            )
        # The final layer is per token: run it in the positions layout, then gather the whole row.
        b, t, nl = self.batch, shards.grid[0], shards.positions
        out = model.final(y.reshape(b, t * nl, -1), cond)
        return gather_positions(out, shards, self.group)


def gather_positions(out: torch.Tensor, shards: STShards, group: dist.ProcessGroup) -> torch.Tensor:
    """Every rank's positions-layout tokens (B, T*HW/P, F) -> the full t-major row (B, T*HW, F)."""
    b, _, f = out.shape
    p, t, nl = shards.world, shards.grid[0], shards.positions
    gathered = torch.empty(p * b, t * nl, f, dtype=out.dtype, device=out.device)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(gathered, out.contiguous(), group=group)
    return gathered.view(p, b, t, nl, f).permute(1, 2, 0, 3, 4).reshape(b, t * p * nl, f)


@torch.no_grad()
def scalefusion_forward(
    model: nn.Module,
    x: torch.Tensor,
    noise_level: torch.Tensor,
    text: torch.Tensor,
    text_mask: torch.Tensor | None = None,
    *,
    drop_text: torch.Tensor | None = None,
    group: dist.ProcessGroup | None = None,
    slicing: ScaleFusionSlicing = ScaleFusionSlicing(),
) -> torch.Tensor:
    """`model(x, noise_level, text, text_mask, drop_text=...)` for latents x (B, C, T, H, W), computed by
    the ranks of `group` together: each gives the same inputs and gets the whole output. The model is a
    sequential ST-DiT; the token grid's T and H*W must divide by the group's size."""
    group = group if group is not None else dist.group.WORLD
    cfg = model.config
    check_stdit(cfg, "ScaleFusion inference")
    if cfg.stdit_block != "sequential":
        raise ValueError(
            "ScaleFusion inference overlaps the sequential ST-DiT block; model.stdit_block is 'parallel' "
            "(its full-attention branch needs every token): run it on one rank per sample"
        )
    if x.ndim != 5:
        raise ValueError(f"ScaleFusion inference takes latents (B, C, T, H, W), got {tuple(x.shape)}")
    grid = token_grid(x.shape[2:], cfg.patch)
    shards = STShards(grid, dist.get_rank(group), dist.get_world_size(group))
    tokens = patchify(x, cfg.patch)
    cond = model.condition(noise_level, text, text_mask, drop_text, batch=x.shape[0], grid=grid)
    out = ScaleFusionSchedule(model, shards, group, slicing).forward(tokens, cond)
    return unpatchify(out, grid, cfg.patch, cfg.in_channels)


def scalefusion_network(
    model: nn.Module,
    group: dist.ProcessGroup | None = None,
    slicing: ScaleFusionSlicing = ScaleFusionSlicing(),
) -> Callable[..., torch.Tensor]:
    """A callable with the model's forward signature that runs `scalefusion_forward` (for
    `sample_latents(..., forward=...)`)."""

    def forward(x, noise_level, text, text_mask=None, *, drop_text=None):
        return scalefusion_forward(
            model, x, noise_level, text, text_mask, drop_text=drop_text, group=group, slicing=slicing
        )

    return forward
