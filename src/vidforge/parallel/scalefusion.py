"""ScaleFusion's overlapped ST-DiT inference schedule (Yang et al., MLSys 2025, "ScaleFusion: scalable
inference of spatial-temporal diffusion transformers for high-resolution long video generation").

The sequence is split over P ranks as in `stdit_parallel`: spatial attention runs with each rank holding
whole frames, temporal attention (with cross-attention and MLP, which are per token) with each rank
holding whole (h, w) positions, and an all-to-all switches between the two layouts. Done plainly, every
all-to-all waits for the whole layer before it and the whole next layer waits for it. ScaleFusion cuts
the work into slices that the all-to-alls run beside.

This is a reading of the paper's abstract and a talk summary (its Algorithm 1 was not available), with
the paper's names:

- N_T (`slices_t`): the spatial phase of a block runs in N_T slices along T (this rank's frames);
  N_S (`slices_s`): the temporal phase in N_S slices along S (this rank's positions). Slice k of a
  phase needs, from the all-to-all into it, one piece from every slice of the phase before.
- L_T (`lookahead_t`), L_S (`lookahead_s`): how many of the spatial (L_T) and temporal (L_S) phase's
  slices have their all-to-all in flight ahead of the slice being computed. With lookahead L a phase of
  N slices runs, for k = 0 .. N-1:

      issue the all-to-all of slice k+L (if k+L < N: its data is complete, the phase before is done)
      wait for slice k's all-to-all; compute slice k; free slice k's receive buffers
      issue piece k of each of the next phase's first L' slices (L' the next phase's lookahead)

  so the all-to-alls of slices 0 .. L-1 are moved into the phase before, one piece per slice of it,
  each leaving as soon as the data it carries is computed, and the later slices' all-to-alls each overlap
  the L computes before their own. L = 1 already overlaps part of every switch; L >= N issues every
  all-to-all during the phase before. The first block's spatial phase has no all-to-all before it, the
  last block's temporal phase none after it (the final layer runs in the positions layout).
- Receive buffers: a slice's are released as soon as its compute is done, so at most min(L+1, N) of a
  phase's slices and the first min(L', N') slices of the next phase hold received data at once (the
  plain schedule holds a whole phase's).

Defaults N_T = N_S = 4, L_T = L_S = 1 (the paper's values were not available): lookahead 1 hides every
all-to-all that takes at most one slice's compute, and a deeper one costs a slice's receive buffer per
step of depth. Counts larger than what a rank holds are clamped (2 local frames cannot make 4 slices),
lookaheads to the phase's slice count.

Every token goes through the same arithmetic as in the plain schedule (N_T = N_S = 1), only in smaller
batches, and every collective is an exact copy, so the result equals the plain schedule's up to float
rounding of the smaller matrix products (the tests measure bitwise equality on CPU float64). Communication
uses torch.distributed's asynchronous all_to_all_single (async_op=True, waited on before use); inference
only (no autograd). Plain batches of the sequential ST-DiT block. `trace`, where given, records each issue,
wait, compute and free in the order done, which the tests hold against the schedule above.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from vidforge.errors import UserInputError
from vidforge.models.rope import sincos_position_embedding
from vidforge.parallel.stdit_parallel import STShards, check_stdit, spatial_sublayer, temporal_sublayers
from vidforge.tokens import patchify, token_grid, unpatchify


@dataclass(frozen=True)
class ScaleFusionSlicing:
    """N_T, N_S, L_T, L_S (see the module docstring); the profile's infer.scalefusion_slices_t /
    _slices_s / _lookahead_t / _lookahead_s, with these defaults."""

    slices_t: int = 4
    slices_s: int = 4
    lookahead_t: int = 1
    lookahead_s: int = 1

    def __post_init__(self) -> None:
        for name in ("slices_t", "slices_s", "lookahead_t", "lookahead_s"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise UserInputError(f"infer.scalefusion_{name}: must be an integer >= 1, got {value!r}")


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


@dataclass(frozen=True)
class _Phase:
    """One half of a block: `spatial` over frame slices, `temporal` over position slices."""

    name: str
    slices: list[tuple[int, int]]
    lookahead: int  # clamped to len(slices)


class ScaleFusionSchedule:
    """The overlapped forward of one model over one token grid on one rank of `group`. `trace`, where
    given, receives ("issue", block, phase, slice, piece), ("wait" | "compute" | "free", block, phase,
    slice) as they are done; piece is the slice of the phase before that an early piece carries, None
    for a whole all-to-all."""

    def __init__(
        self,
        model: nn.Module,
        shards: STShards,
        group: dist.ProcessGroup,
        slicing: ScaleFusionSlicing,
        trace: list | None = None,
    ):
        self.model, self.shards, self.group, self.trace = model, shards, group, trace
        self.frame_slices = even_splits(shards.frames, slicing.slices_t)
        self.position_slices = even_splits(shards.positions, slicing.slices_s)
        self.spatial = _Phase("spatial", self.frame_slices, min(slicing.lookahead_t, len(self.frame_slices)))
        self.temporal = _Phase(
            "temporal", self.position_slices, min(slicing.lookahead_s, len(self.position_slices))
        )

    def _note(self, *event) -> None:
        if self.trace is not None:
            self.trace.append(event)

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

    # --- Algorithm 1: one phase -----------------------------------------------------------------------

    def _issue(self, block: int, phase: _Phase, k: int, source: torch.Tensor, piece: int | None) -> _Exchange:
        """The all-to-all into slice k of `phase` from `source`, the phase before's output: whole, or only
        the part computed by that phase's slice `piece`."""
        self._note("issue", block, phase.name, k, piece)
        if phase.name == "temporal":
            frames = (0, self.shards.frames) if piece is None else self.frame_slices[piece]
            return self._send_positions(source, frames, self.position_slices[k])
        positions = (0, self.shards.positions) if piece is None else self.position_slices[piece]
        return self._send_frames(source, self.frame_slices[k], positions)

    def _receive(
        self, block: int, phase: _Phase, pending: dict[int, list[_Exchange]], k: int
    ) -> torch.Tensor:
        """Slice k's input, its all-to-all's pieces waited on and taken out of `pending`."""
        self._note("wait", block, phase.name, k)
        pieces = [e.result() for e in pending.pop(k)]
        return (self._positions_input if phase.name == "temporal" else self._frames_input)(pieces)

    def _run_phase(
        self,
        block: int,
        phase: _Phase,
        compute: Callable[[int, torch.Tensor], torch.Tensor],
        out: torch.Tensor,
        fed: tuple[torch.Tensor, dict[int, list[_Exchange]]] | tuple[Callable[[int], torch.Tensor], None],
        after: tuple[int, _Phase] | None,
    ) -> dict[int, list[_Exchange]]:
        """Slice by slice, `compute(k, input)` placed into `out`, with the all-to-alls of the module
        docstring. `fed`: (the phase before's output, the all-to-alls already in flight into this phase),
        or, for the first phase, (a callable giving slice k's input, None). `after`: the block and phase
        this one's output feeds (None for the last). Returns the all-to-alls issued into it."""
        source, pending = fed
        upcoming: dict[int, list[_Exchange]] = {j: [] for j in range(after[1].lookahead)} if after else {}
        n = len(phase.slices)
        for k in range(n):
            if pending is None:
                self._note("compute", block, phase.name, k)
                self._place(phase, out, k, compute(k, source(k)))
            else:
                if k + phase.lookahead < n:
                    ahead = k + phase.lookahead
                    pending[ahead] = [self._issue(block, phase, ahead, source, None)]
                x = self._receive(block, phase, pending, k)
                self._note("compute", block, phase.name, k)
                self._place(phase, out, k, compute(k, x))
                del x  # the last reference to slice k's received data
                self._note("free", block, phase.name, k)
            for j in upcoming:
                upcoming[j].append(self._issue(after[0], after[1], j, out, k))
        return upcoming

    @staticmethod
    def _place(phase: _Phase, out: torch.Tensor, k: int, y: torch.Tensor) -> None:
        """Slice k's output tokens y (B, tokens, C) into the phase's output: frames layout (B, T/P, HW, C)
        for the spatial phase, positions layout (B, T, HW/P, C) for the temporal one."""
        start, count = phase.slices[k]
        b, t, _, ch = out.shape
        if phase.name == "spatial":
            out[:, start : start + count] = y.view(b, count, -1, ch)
        else:
            out[:, :, start : start + count] = y.view(b, t, count, ch)

    # --- the whole model ----------------------------------------------------------------------------------

    def forward(self, tokens: torch.Tensor, cond) -> torch.Tensor:
        """Full token row (B, S, patch_dim) -> full output (B, S, patch_dim), on every rank."""
        model, shards = self.model, self.shards
        config = model.config
        batch, device, dtype = tokens.shape[0], tokens.device, model.param_dtype
        cos, sin = cond.rope
        frame_ropes, frame_scopes = [], []
        for f, m in self.frame_slices:
            index = shards.frame_token_index(f, m).to(device)
            frame_ropes.append((cos[index], sin[index]))
            frame_scopes.append(shards.frame_scope(batch, m))
        position_ropes, position_scopes = [], []
        for c, n in self.position_slices:
            index = shards.position_token_index(c, n).to(device)
            position_ropes.append((cos[index], sin[index]))
            position_scopes.append(shards.position_scope(batch, n))

        lo, hi = shards.token_range
        h = model.patch_embed(tokens[:, lo:hi])
        if config.abs_position == "sincos":
            h = h + sincos_position_embedding(cond.positions[lo:hi], config.hidden, h.dtype)
        h = h.view(batch, shards.frames, shards.hw, -1)

        def embedded(k: int) -> torch.Tensor:
            f, m = self.frame_slices[k]
            return h[:, f : f + m].reshape(batch, -1, h.shape[-1])

        fed: tuple = (embedded, None)
        blocks = list(model.blocks.values())
        frames_shape = (batch, shards.frames, shards.hw, config.hidden)
        positions_shape = (batch, shards.grid[0], shards.positions, config.hidden)
        for b, block in enumerate(blocks):
            mods = block.modulation(cond)

            def spatial(k, x, block=block, mods=mods):
                return spatial_sublayer(block, x, mods, frame_ropes[k], frame_scopes[k])

            def temporal(k, x, block=block, mods=mods):
                return temporal_sublayers(block, x, mods, position_ropes[k], position_scopes[k], cond)

            frames = torch.empty(frames_shape, dtype=dtype, device=device)
            pending = self._run_phase(b, self.spatial, spatial, frames, fed, (b, self.temporal))
            # The positions-layout output before has sent its last whole all-to-all: drop it.
            fed = positions = None
            positions = torch.empty(positions_shape, dtype=dtype, device=device)
            after = (b + 1, self.spatial) if b + 1 < len(blocks) else None
            pending = self._run_phase(b, self.temporal, temporal, positions, (frames, pending), after)
            fed, frames = (positions, pending), None
        # The final layer is per token: run it in the positions layout, then gather the whole row.
        out = model.final(positions.reshape(batch, -1, config.hidden), cond)
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
    trace: list | None = None,
) -> torch.Tensor:
    """`model(x, noise_level, text, text_mask, drop_text=...)` for latents x (B, C, T, H, W), computed by
    the ranks of `group` together: each gives the same inputs and gets the whole output. The model is a
    sequential ST-DiT; the token grid's T and H*W must divide by the group's size. `trace`: a list that
    receives the schedule's events (`ScaleFusionSchedule`)."""
    group = group if group is not None else dist.group.WORLD
    config = model.config
    check_stdit(config, "ScaleFusion inference")
    if config.stdit_block != "sequential":
        raise UserInputError(
            "ScaleFusion inference overlaps the sequential ST-DiT block; model.stdit_block is 'parallel' "
            "(its full-attention branch needs every token): run it on one rank per sample"
        )
    if x.ndim != 5:
        raise ValueError(f"ScaleFusion inference takes latents (B, C, T, H, W), got {tuple(x.shape)}")
    grid = token_grid(x.shape[2:], config.patch)
    shards = STShards(grid, dist.get_rank(group), dist.get_world_size(group))
    tokens = patchify(x, config.patch)
    cond = model.condition(noise_level, text, text_mask, drop_text, batch=x.shape[0], grid=grid)
    out = ScaleFusionSchedule(model, shards, group, slicing, trace).forward(tokens, cond)
    return unpatchify(out, grid, config.patch, config.in_channels)


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
