"""Context parallel for joint attention (MM-DiT: HunyuanVideo-1.5's double-stream blocks): one attention
over [video tokens, caption tokens] where only the video tokens are split over the cp ranks
(`TokenShard`) and every rank holds the whole caption stream (it is short, and each rank's video tokens
read all of it). q, k and v are (B, local + L, H, D): this rank's video tokens, then the L caption tokens
(the same on every rank); the output is laid out the same way. `JointShard` is the mask the family hands
its attention; `ContextParallelAttend` (`apply_cp`) evaluates it with `joint_attention`.

- all-gather: the video K/V of every rank gathered in row order (pads dropped), the caption's appended;
  every rank's queries, its video tokens and the whole caption, attend to that. The caption's outputs are
  then the same on every rank, each rank's computed from the same numbers.
- ulysses: one all-to-all turns the video q/k/v into (every video token, this rank's H/cp heads); the
  caption's q/k/v are sliced to the same heads; attention runs over [video, caption] for those heads; the
  video part goes back by the inverse all-to-all, the caption part is all-gathered over the heads.
- ring: every query of the rank (its video tokens and the whole caption: the caption's outputs read
  every video token too) attends to the caption's keys once, on its own rank, then to each rank's video
  block as it passes (`cp_attention.ring_forward`, the ring of full attention: blocks merged by their
  log-sum-exp, the next transfer overlapping this block's compute). Only the video K/V travel, so the
  caption's keys enter every softmax once. Each block is a prefix of keys that every query sees
  (`PrefixKeys`): a rank's real video tokens, or a row's valid caption tokens, put first
  (`JointShard.caption_order`), so the fused kernels run unmasked. The caption's outputs are the same
  on every rank up to rounding (each rank merges the blocks in its own order).
- usp: Ulysses inside `parallel.cp_ulysses` consecutive ranks (as `usp_attention` does: the video
  tokens all-to-all'd to the group's tokens, H/u heads, in `GroupShard` order; the caption sliced to
  those heads), the ring above across the groups, and back as Ulysses does.

Gradients: every rank backpropagates its share of the loss (`shard_loss`); the caption stream is
replicated, so its gradients on one rank hold that rank's share only, and the collectives' backwards (a
reduce-scatter, or the ring's key gradients travelling to their owner: sums over ranks) and FSDP's
reduction over cp add the shares up to the single-process gradient. parallel.cp_regather is refused:
the all-gather's re-gathered backward (`cp_attention._regathered`) meets a copy (aten._to_copy, SDPA's
boolean key mask) in its recompute that the forward did not record, and the other implementations gather
nothing to re-gather.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from vidforge.attention.dispatch import attention
from vidforge.errors import UserInputError
from vidforge.parallel.attention_blocks import (
    BlockKernel,
    PrefixKeys,
    block_backward,
    block_forward,
    block_kernel,
    finite_lse,
)
from vidforge.parallel.cp_attention import (
    RING_QUERY_CHUNK,
    Ring,
    gather_tokens,
    heads_to_tokens,
    ring_backward,
    ring_forward,
    tokens_to_heads,
)
from vidforge.parallel.usp_attention import GroupShard, UspGroups, group_order, ulysses_degree
from vidforge.tokens import ContextShard, KeyPadding, TokenShard


@dataclass(eq=False)
class JointShard(ContextShard):
    """Joint attention's mask under context parallel: `shard` splits the video tokens, `keys` (B, L) bool
    says which of the L replicated tokens after them are keys (the caption's padding masked out)."""

    keys: torch.Tensor
    made_from: tuple | None = field(default=None, repr=False)
    """(keys, order, counts): `caption_order` and the keys it was made from. A field, so that copies
    (FSDP's input casting rebuilds the mask with `dataclasses.replace`) keep it; a copy with other keys
    makes its own."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.shard.packed:
            raise ValueError("JointShard splits a plain batch's video tokens; packed rows are not built")
        if self.keys.ndim != 2 or self.keys.dtype != torch.bool:
            raise ValueError(
                f"JointShard.keys must be (B, L) bool, got {self.keys.dtype} {tuple(self.keys.shape)}"
            )
        if self.made_from is None or self.made_from[0] is not self.keys:
            order = torch.argsort((~self.keys).to(torch.int8), dim=1, stable=True)
            self.made_from = (self.keys, order, tuple(self.keys.sum(dim=1).tolist()))

    @property
    def caption_order(self) -> tuple[torch.Tensor, tuple[int, ...]]:
        """(B, L): the caption tokens' positions, each row's keys first (in order), and each row's number
        of keys: the ring's caption block as a prefix of keys. Made with the mask, outside the (compiled,
        checkpointed) blocks, once for all of them."""
        return self.made_from[1], self.made_from[2]


def _key_mask(mask: JointShard, video: int) -> KeyPadding:
    """Every video key of the row (`video` of them, the gathered real ones) and the valid caption keys."""
    ones = torch.ones((mask.keys.shape[0], video), dtype=torch.bool, device=mask.keys.device)
    return KeyPadding(torch.cat([ones, mask.keys], dim=1))


def joint_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: JointShard,
    group: dist.ProcessGroup,
    impl: str,
    backend: str = "sdpa",
    sdpa_backend: str = "auto",
    regather: bool = False,
    usp_groups: UspGroups | None = None,
) -> torch.Tensor:
    """Joint attention over a row whose video tokens `mask.shard` splits over `group` (module docstring);
    `usp_groups`: the Ulysses and ring sub-groups of `group` under usp."""
    if regather:
        # Re-gathering in the backward (the gather under selective checkpointing, `cp_attention._regathered`)
        # meets an op in the recompute of SDPA's key-padded path that the forward did not record (a copy),
        # which torch's checkpoint refuses.
        raise UserInputError(
            "parallel.cp_regather: joint attention keeps the gathered video K/V for its backward (re-gathering "
            "is not built for it); set parallel.cp_regather=false"
        )
    if impl == "all-gather":
        return _all_gather(q, k, v, mask, group, backend, sdpa_backend)
    if impl == "ulysses":
        return _ulysses(q, k, v, mask, group, backend, sdpa_backend)
    if impl == "ring":
        return _ring(q, k, v, mask, mask.shard, group, backend, sdpa_backend)
    if impl == "usp":
        return _usp(q, k, v, mask, backend, sdpa_backend, usp_groups)
    raise ValueError(f"joint attention has no context-parallel implementation {impl!r}")


def _all_gather(q, k, v, mask: JointShard, group, backend, sdpa_backend) -> torch.Tensor:
    shard, local = mask.shard, mask.shard.local
    dk = k.shape[-1]
    kv = shard.assemble(gather_tokens(torch.cat([k[:, :local], v[:, :local]], dim=-1), group))
    k_video, v_video = kv.split([dk, kv.shape[-1] - dk], dim=-1)  # the real video keys in row order
    k_all, v_all = torch.cat([k_video, k[:, local:]], dim=1), torch.cat([v_video, v[:, local:]], dim=1)
    return attention(q, k_all, v_all, _key_mask(mask, shard.total), backend, sdpa_backend)


def _ulysses(q, k, v, mask: JointShard, group, backend, sdpa_backend) -> torch.Tensor:
    shard, local = mask.shard, mask.shard.local
    size, heads = shard.size, q.shape[2]
    if heads % size:
        raise UserInputError(
            f"parallel.cp_impl=ulysses splits the {heads} attention heads over cp={size} ranks; make "
            "model.heads divisible by parallel.cp, or use parallel.cp_impl=all-gather or ring"
        )
    dims = (q.shape[-1], k.shape[-1], v.shape[-1])
    video = heads_to_tokens(torch.cat([q[:, :local], k[:, :local], v[:, :local]], dim=-1), group)
    qv, kv, vv = video.split(dims, dim=-1)  # every rank's video tokens (gathered order), my heads
    real = shard.gathered_row_index(q.device)  # the real video keys, in row order
    caption = _caption_heads((q, k, v), local, group)
    out = attention(
        torch.cat([qv, caption[0]], dim=1),
        torch.cat([kv.index_select(1, real), caption[1]], dim=1),
        torch.cat([vv.index_select(1, real), caption[2]], dim=1),
        _key_mask(mask, real.shape[0]),
        backend,
        sdpa_backend,
    )
    out_video, out_caption = out.split([qv.shape[1], out.shape[1] - qv.shape[1]], dim=1)
    return torch.cat([tokens_to_heads(out_video, group), _gather_heads(out_caption, group)], dim=1)


def _caption_heads(qkv: tuple[torch.Tensor, ...], local: int, group) -> list[torch.Tensor]:
    """The caption's q, k, v (after the `local` video tokens) sliced to the heads `heads_to_tokens`
    gives this rank of the Ulysses group (rank r: head group r)."""
    size, heads = dist.get_world_size(group), qkv[0].shape[2]
    rank = dist.get_rank(group)
    mine = slice(rank * (heads // size), (rank + 1) * (heads // size))
    return [t[:, local:, mine] for t in qkv]


def _gather_heads(out_caption: torch.Tensor, group) -> torch.Tensor:
    """The caption's output heads from every rank of the Ulysses group, gathered along the heads (moved
    to dim 1 for gather_tokens, whose backward sums the ranks' shares of the gradient)."""
    return gather_tokens(out_caption.transpose(1, 2), group).transpose(1, 2)


# --- ring and usp -------------------------------------------------------------------------------------


def _ring(q, k, v, mask: JointShard, shard: TokenShard, group, backend, sdpa_backend) -> torch.Tensor:
    """The ring over `group`, whose ranks hold `shard`'s video tokens (the cp shard, or usp's
    `GroupShard`) and the whole caption; q, k, v (B, shard.local + L, H, D)."""
    local = shard.local
    order, counts = mask.caption_order
    index = order[:, :, None, None].expand(-1, -1, *k.shape[2:])
    k_caption, v_caption = (t[:, local:].gather(1, index) for t in (k, v))  # each row's keys first
    kernel = block_kernel(backend, sdpa_backend, q, RING_QUERY_CHUNK)
    video = functools.partial(_video_keys, shard)
    return _JointRing.apply(q, k[:, :local], v[:, :local], k_caption, v_caption, counts, video, group, kernel)


def _video_keys(shard: TokenShard, source: int) -> PrefixKeys:
    """Rank `source`'s video block: its real tokens first (one sample a row), seen by every query."""
    (count,) = shard.local_counts(source)
    return PrefixKeys(count)


def _usp(q, k, v, mask: JointShard, backend, sdpa_backend, groups: UspGroups | None) -> torch.Tensor:
    """Ulysses over `groups.ulysses` (its ranks' video tokens, H/u heads, in `GroupShard` order; the
    caption's q, k, v sliced to those heads), the joint ring over `groups.ring`, and back."""
    shard, local = mask.shard, mask.shard.local
    inner = ulysses_degree(shard, q.shape[2], groups)
    if inner == 1:
        return _ring(q, k, v, mask, shard, groups.ring, backend, sdpa_backend)
    if inner == shard.size:
        return _ulysses(q, k, v, mask, groups.ulysses, backend, sdpa_backend)
    dims = (q.shape[-1], k.shape[-1], v.shape[-1])
    video = heads_to_tokens(torch.cat([q[:, :local], k[:, :local], v[:, :local]], dim=-1), groups.ulysses)
    order = group_order(shard, inner, q.device)  # the group's tokens, each row's real ones first
    qv, kv, vv = video.index_select(1, order).split(dims, dim=-1)
    caption = _caption_heads((q, k, v), local, groups.ulysses)
    qkv = (torch.cat([part, cap], dim=1) for part, cap in zip((qv, kv, vv), caption, strict=True))
    out = _ring(*qkv, mask, GroupShard.of(shard, inner), groups.ring, backend, sdpa_backend)
    out_video, out_caption = out.split([qv.shape[1], out.shape[1] - qv.shape[1]], dim=1)
    out_video = tokens_to_heads(out_video.index_select(1, torch.argsort(order)), groups.ulysses)
    return torch.cat([out_video, _gather_heads(out_caption, groups.ulysses)], dim=1)


class _JointRing(torch.autograd.Function):
    """q (B, Lq, H, D), every query of the rank, against the caption's keys (B, L, H, D; row b's first
    counts[b] seen) once and the ring's video blocks (this rank's: B, local, H, D)."""

    @staticmethod
    def forward(ctx, q, k, v, k_caption, v_caption, counts, video_keys, group, kernel: BlockKernel):
        scale = 1.0 / math.sqrt(q.shape[-1])
        caption = _CaptionBlock.of(counts, q.device)
        out, lse = caption.forward(kernel, q, k_caption, v_caption, scale)  # its own keys: nothing to send
        out, lse = ring_forward(Ring(group), q, k, v, video_keys, kernel, scale, out, lse)
        ctx.save_for_backward(q, k, v, k_caption, v_caption, out, lse)
        ctx.ring = (caption, video_keys, group, kernel, scale)
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, k_caption, v_caption, out, lse = ctx.saved_tensors
        caption, video_keys, group, kernel, scale = ctx.ring
        lse = finite_lse(lse)  # every query has a key somewhere in the row
        dq, dk, dv = ring_backward(Ring(group), grad_out, q, k, v, out, lse, video_keys, kernel, scale)
        dq_c, dk_c, dv_c = caption.backward(kernel, grad_out, q, k_caption, v_caption, out, lse, scale)
        grads = [
            g.to(t.dtype)
            for g, t in zip((dq + dq_c, dk, dv, dk_c, dv_c), (q, k, v, k_caption, v_caption), strict=True)
        ]
        return (*grads, None, None, None, None)


@dataclass(frozen=True)
class _CaptionBlock:
    """The caption's keys as one block per group of batch rows with the same number of keys (`PrefixKeys`
    takes one count): (rows, keys) pairs, rows a slice (every row) or an index."""

    groups: tuple[tuple[slice | torch.Tensor, PrefixKeys], ...]

    @classmethod
    def of(cls, counts: tuple[int, ...], device: torch.device) -> _CaptionBlock:
        if len(set(counts)) == 1:
            return cls(((slice(None), PrefixKeys(counts[0])),))
        rows = {c: [b for b, n in enumerate(counts) if n == c] for c in counts}
        return cls(tuple((torch.tensor(r, device=device), PrefixKeys(c)) for c, r in rows.items()))

    def forward(self, kernel, q, k, v, scale) -> tuple[torch.Tensor, ...]:
        """(out, lse) of q against the caption block, in the compute dtype."""
        parts = [block_forward(kernel, q[r], k[r], v[r], keys, scale) for r, keys in self.groups]
        return self._rows(parts, q.shape[0])

    def backward(self, kernel, grad_out, q, k, v, out, lse, scale) -> tuple[torch.Tensor, ...]:
        """The caption block's dq, dk, dv, given the merged output and log-sum-exp."""
        parts = [
            block_backward(kernel, grad_out[r], q[r], k[r], v[r], out[r], lse[r], keys, scale)
            for r, keys in self.groups
        ]
        return self._rows(parts, q.shape[0])

    def _rows(self, parts: list, batch: int) -> tuple[torch.Tensor, ...]:
        """Each group's tensors put back at its rows of the batch."""
        if len(parts) == 1:
            return tuple(parts[0])
        full = [t.new_empty((batch, *t.shape[1:])) for t in parts[0]]
        for (rows, _), part in zip(self.groups, parts, strict=True):
            for whole, t in zip(full, part, strict=True):
                whole[rows] = t
        return tuple(full)
