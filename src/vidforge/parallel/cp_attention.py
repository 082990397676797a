"""Context-parallel full attention: this rank's queries against the keys of a row split over the cp
group (`TokenShard`), in three ways. All take q, k, v as this rank's tokens (B, local, H, D) and return
this rank's output (B, local, H, D); all are differentiable on CPU (gloo) and GPU (NCCL).

- `all_gather_attention` (NeMo / Megatron's all-gather CP): gather K and V over the group (one
  collective; its backward is a reduce-scatter of their gradients), put the real keys in row order, and
  run the ordinary dispatcher: the local query chunk of sample i attends to the whole of sample i
  (`Segments(chunk_lens, seqlens)`), any backend. Memory: the full K/V row on every rank, kept for the
  backward; with `regather=True` (`parallel.cp_regather`, as NeMo/Transformer Engine do) only the local
  shard is kept and the backward gathers again (`_regathered`).
- `ring_attention`: K/V blocks travel around the ring with point-to-point sends, each rank merging
  per-block partial outputs by their log-sum-exp, each block computed by a fused attention kernel that
  returns it (`vidforge.parallel.attention_blocks`); the next transfer is posted before the current block
  is computed, so communication overlaps compute. Backward is the flash-attention backward per block,
  with the key-gradient accumulators travelling the ring behind the blocks and arriving at their owner
  after a full turn. Memory: two K/V blocks.
- `ulysses_attention` (DeepSpeed-Ulysses): one all-to-all turns (all tokens of mine, all heads) into
  (all tokens, my heads), attention runs over the whole row for H/cp heads with the dispatcher, and one
  all-to-all turns it back. Needs heads % cp == 0.

Pads (see `TokenShard`) are never keys: the all-gather and Ulysses paths drop them when ordering keys,
the ring masks them. Pad queries attend to their own sample, so their outputs are finite.

Sliding-tile attention (`tiles`, a `vidforge.attention.sliding_tile.TiledShard`): all-gather and Ulysses
attend their queries to the gathered row under the windows' mask (`TileRows`: FlexAttention's block
mask under `flex`, the masked reference otherwise); the ring runs every block on the einsum kernel under
its slice of the mask (`MaskedKeys`), a query row with no key in a block giving output 0 and
log-sum-exp -inf, which the merge ignores. usp is refused (`SLIDING_TILE_CP_IMPLS`).
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable

import torch
import torch.distributed as dist

from vidforge.attention.dispatch import attention
from vidforge.attention.sliding_tile import TiledShard
from vidforge.errors import UserInputError
from vidforge.parallel.attention_blocks import (
    BlockKernel,
    BlockKeys,
    MaskedKeys,
    PrefixKeys,
    block_backward,
    block_forward,
    block_kernel,
    finite_lse,
)
from vidforge.parallel.attention_blocks import (  # the ring's arithmetic, tested on its own
    block_attention as block_attention,
)
from vidforge.parallel.attention_blocks import (
    merge_partial as merge_partial,
)
from vidforge.tokens import Segments, TokenShard

# torch >= 2.14 renames the tensor-in/tensor-out collectives; the GPU machine runs 2.11.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


# --- collectives with autograd ----------------------------------------------------------------------


class _GatherTokens(torch.autograd.Function):
    """(B, L, ...) per rank -> (B, size*L, ...) in gathered order; backward reduce-scatters the
    gradient (every rank's queries contributed to every rank's keys)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        size = dist.get_world_size(group)
        out = x.new_empty((size * x.shape[0], *x.shape[1:]))  # rank blocks concatenated along dim 0
        _all_gather_single(out, x.contiguous(), group=group)
        return out.unflatten(0, (size, -1)).movedim(0, 1).flatten(1, 2)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        size = dist.get_world_size(ctx.group)
        per_rank = grad.unflatten(1, (size, -1)).movedim(1, 0).flatten(0, 1).contiguous()
        out = per_rank.new_empty((per_rank.shape[0] // size, *per_rank.shape[1:]))
        _reduce_scatter_single(out, per_rank, group=ctx.group)
        return out, None


def gather_tokens(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """All-gather along dim 1 (tokens), differentiable: (B, L, ...) -> (B, size*L, ...)."""
    return _GatherTokens.apply(x, group)


class _AllToAll(torch.autograd.Function):
    """all_to_all_single over dim 0 with equal splits; its own inverse, so backward is the same."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return _all_to_all(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _all_to_all(grad, ctx.group), None


def _all_to_all(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    x = x.contiguous()  # first: empty_like keeps a permuted view's strides, the collective assumes dense
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x, group=group)
    return out


# --- all-gather ---------------------------------------------------------------------------------------


def _full_row_segments(shard: TokenShard, queries: tuple[int, ...]) -> Segments | None:
    """Queries (grouped by sample as `queries` says) against every real key of their sample."""
    if not shard.packed:
        return None  # one sample per row: every query sees every (real) key
    return Segments(queries, shard.layout.seqlens)


def all_gather_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    shard: TokenShard,
    group: dist.ProcessGroup,
    backend: str = "sdpa",
    sdpa_backend: str = "auto",
    regather: bool = False,
    tiles: TiledShard | None = None,
) -> torch.Tensor:
    """All-gather context parallel (see the module docstring); `tiles`: sliding-tile attention's windows
    over the row (this rank's queries against the gathered row under `TiledShard.rows`)."""
    dk = k.shape[-1]
    # One collective for both. Under re-gather this local copy is what the backward keeps (v alone may be
    # a view of the q/k/v projection's output, which would keep that whole output alive).
    kv_local = torch.cat([k, v], dim=-1)

    if tiles is None:
        keys = _full_row_segments(shard, shard.chunk_lens)
    else:
        keys = tiles.rows(q.device)
        keys.prepare(backend, q)  # before the re-gathered region, which must replay its ops exactly

    def gathered_attention(q: torch.Tensor, kv_local: torch.Tensor) -> torch.Tensor:
        kv = shard.assemble(gather_tokens(kv_local, group))  # real keys in row order
        k_full, v_full = kv.split([dk, kv.shape[-1] - dk], dim=-1)
        return attention(q, k_full, v_full, keys, backend, sdpa_backend)

    if regather and torch.is_grad_enabled() and shard.size > 1:
        return _regathered(gathered_attention, q, kv_local)
    return gathered_attention(q, kv_local)


# What the backward may run again: the collectives and the copies and index ops that put the gathered keys
# in row order. Everything else (the attention kernel's output and log-sum-exp above all) is saved, so the
# backward re-gathers K/V but does not recompute attention.
_REGATHER_NAMESPACES = ("c10d", "_c10d_functional")
_REGATHER_OPS = frozenset(
    "cat new_empty empty empty_like index_select index split split_with_sizes slice select clone _to_copy "
    "copy_ contiguous view _unsafe_view reshape permute transpose unflatten movedim expand t".split()
)


def _regather_policy(ctx, op, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy

    if op.namespace in _REGATHER_NAMESPACES or op._opname in _REGATHER_OPS:
        return CheckpointPolicy.PREFER_RECOMPUTE
    return CheckpointPolicy.MUST_SAVE


# Saved tensors of the region go through the caller's saved-tensor hooks (activation offload, the memory
# measurement) where this torch can say so (2.14); older ones always bypass them.
_RESPECT_HOOKS = (
    {"respect_saved_tensors_hooks": True}
    if "respect_saved_tensors_hooks" in inspect.signature(torch.utils.checkpoint.checkpoint).parameters
    else {}
)


def _regathered(fn, q: torch.Tensor, kv_local: torch.Tensor) -> torch.Tensor:
    """`fn(q, kv_local)` under torch's selective activation checkpointing: the forward keeps q, the local
    K/V and the attention's own outputs; the backward runs the all-gather again (every rank reaches it in
    the same order, as it does the forward's) instead of keeping (cp - 1) / cp of the row's K/V."""
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    context = functools.partial(create_selective_checkpoint_contexts, _regather_policy)
    return checkpoint(fn, q, kv_local, use_reentrant=False, context_fn=context, **_RESPECT_HOOKS)


# --- Ulysses ------------------------------------------------------------------------------------------


def ulysses_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    shard: TokenShard,
    group: dist.ProcessGroup,
    backend: str = "sdpa",
    sdpa_backend: str = "auto",
    tiles: TiledShard | None = None,
) -> torch.Tensor:
    """Ulysses context parallel (see the module docstring); `tiles`: sliding-tile attention's windows
    over the row (every rank's queries in gathered order against the row: `TiledShard.gathered_rows`)."""
    size = shard.size
    heads = q.shape[2]
    if heads % size:
        raise UserInputError(
            f"parallel.cp_impl=ulysses splits the {heads} attention heads (per tensor-parallel rank) over "
            f"cp={size} ranks; make model.heads / parallel.tp divisible by parallel.cp, or use all-gather or ring"
        )
    dims = (q.shape[-1], k.shape[-1], v.shape[-1])
    # (B, L, H, Dq+Dk+Dv): one all-to-all for all three
    qkv = heads_to_tokens(torch.cat([q, k, v], dim=-1), group)
    qg, kg, vg = qkv.split(dims, dim=-1)
    if tiles is not None:  # queries stay in gathered order, the mask names them; keys: the row's real tokens
        keys = shard.gathered_row_index(q.device)
        rows = tiles.gathered_rows(q.device)
        out = attention(qg, kg.index_select(1, keys), vg.index_select(1, keys), rows, backend, sdpa_backend)
    elif shard.gathered_is_row_order:  # one sample per row, no pads: the gathered row is the row
        out = attention(qg, kg, vg, None, backend, sdpa_backend)
    else:
        order = shard.gathered_padded_order(q.device)  # queries: samples contiguous, pads included
        keys = shard.gathered_row_index(q.device)  # keys: real tokens only
        out = attention(
            qg.index_select(1, order),
            kg.index_select(1, keys),
            vg.index_select(1, keys),
            _full_row_segments(shard, shard.padded_lens),
            backend,
            sdpa_backend,
        )
        out = out.index_select(1, torch.argsort(order))  # back to gathered order
    return tokens_to_heads(out, group)


def heads_to_tokens(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Ulysses's first all-to-all, differentiable: this rank's tokens with every head (B, L, H, D) ->
    every rank's tokens (gathered order) with this rank's group of H/size heads (B, size*L, H/size, D)."""
    size, heads = dist.get_world_size(group), x.shape[2]
    # to rank j: my tokens, head group j  ->  from rank j: its tokens, my head group
    send = x.unflatten(2, (size, heads // size)).permute(2, 0, 1, 3, 4)
    recv = _AllToAll.apply(send, group)  # (size, B, L, H/size, D)
    return recv.movedim(0, 1).flatten(1, 2)


def tokens_to_heads(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """The inverse of `heads_to_tokens`: (B, size*L, H/size, D) -> (B, L, H, D)."""
    size = dist.get_world_size(group)
    b, gathered, group_heads, d = x.shape
    # to rank j: its tokens, my head group  ->  from rank j: my tokens, head group j
    send = x.unflatten(1, (size, gathered // size)).movedim(1, 0)  # (size, B, L, H/size, D)
    recv = _AllToAll.apply(send, group)
    return recv.permute(1, 2, 0, 3, 4).reshape(b, gathered // size, size * group_heads, d)


# --- ring ---------------------------------------------------------------------------------------------


class Ring:
    """Point-to-point neighbours of this rank in the cp group: send to rank+1, receive from rank-1."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.next = dist.get_global_rank(group, (self.rank + 1) % self.size)
        self.prev = dist.get_global_rank(group, (self.rank - 1) % self.size)

    def shift(self, tensor: torch.Tensor, tag: int) -> tuple[torch.Tensor, list]:
        """Post sending `tensor` to the next rank and receiving the previous rank's into a new buffer;
        returns the buffer and the requests to wait on before reading it."""
        buffer = torch.empty_like(tensor)
        ops = [
            dist.P2POp(dist.isend, tensor, self.next, self.group, tag),
            dist.P2POp(dist.irecv, buffer, self.prev, self.group, tag),
        ]
        return buffer, dist.batch_isend_irecv(ops)


def _wait(requests: list) -> None:
    for request in requests:
        request.wait()


def _block_keys(shard: TokenShard, source: int) -> BlockKeys:
    """Which of rank `source`'s tokens (as keys) each local query sees: its sample's real tokens there.
    Every rank holds each sample's piece at the same local positions, real tokens first."""
    return BlockKeys(shard.chunk_lens, shard.local_counts(source))


def _keys_of(shard: TokenShard, tiles: TiledShard | None, device: torch.device):
    """Rank `source` -> which of its tokens each local query sees: `_block_keys`, or under sliding-tile
    attention the windows' block of the mask (`TiledShard.block`)."""
    if tiles is None:
        return functools.partial(_block_keys, shard)
    return lambda source: MaskedKeys(functools.partial(tiles.block, source, device))


RING_QUERY_CHUNK = 2048
"""Queries per score tensor in the einsum ring (`model.attention=dense`): bounds the (B, H, chunk,
local) scores, which for whole blocks of a long sequence would not fit (9k local tokens x 24 heads is
8 GB in float32). The fused kernels never hold the scores and take the whole block."""

KeysOf = Callable[[int], BlockKeys | MaskedKeys | PrefixKeys]
"""Rank `source` -> which of its block's keys each of this rank's queries sees."""


def ring_forward(
    ring: Ring, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys_of: KeysOf, kernel: BlockKernel,
    scale: float, out: torch.Tensor | None = None, lse: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The ring's forward: q against every rank's k, v block (they travel the ring), each block merged by
    log-sum-exp into (out, lse), which may hold blocks merged before (None: none yet). Compute dtype."""
    dk = k.shape[-1]
    block = torch.cat([k, v], dim=-1).contiguous()  # travels in the input dtype
    for step in range(ring.size):
        source = (ring.rank - step) % ring.size
        if step + 1 < ring.size:  # overlap: the next block is on its way while this one computes
            incoming, requests = ring.shift(block, tag=0)
        kb, vb = block.split([dk, block.shape[-1] - dk], dim=-1)
        part = block_forward(kernel, q, kb, vb, keys_of(source), scale)
        out, lse = part if out is None else merge_partial(out, lse, *part)
        if step + 1 < ring.size:
            _wait(requests)
            block = incoming
    return out, lse


def ring_backward(
    ring: Ring, grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    lse: torch.Tensor, keys_of: KeysOf, kernel: BlockKernel, scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """The ring's backward from the merged output `out` and log-sum-exp `lse` (finite): the ring blocks'
    share of dq, and the gradients of this rank's k and v (every rank's queries' share), compute dtype."""
    dk = k.shape[-1]
    block = torch.cat([k, v], dim=-1).contiguous()
    grad_block = block.new_zeros(block.shape, dtype=out.dtype)  # the block in hand's gradient so far
    grad_requests: list = []
    dq = torch.zeros(q.shape, dtype=out.dtype, device=q.device)
    for step in range(ring.size):
        source = (ring.rank - step) % ring.size
        if step + 1 < ring.size:
            incoming, requests = ring.shift(block, tag=1)
        kb, vb = block.split([dk, block.shape[-1] - dk], dim=-1)
        dq_b, dk_b, dv_b = block_backward(kernel, grad_out, q, kb, vb, out, lse, keys_of(source), scale)
        dq += dq_b
        # The accumulator arrived (overlapped with the compute above) from the previous rank with
        # this block; add to it and pass it on: after the last step it reaches the block's owner.
        _wait(grad_requests)
        grad_block, grad_requests = ring.shift(grad_block + torch.cat([dk_b, dv_b], dim=-1), tag=2)
        if step + 1 < ring.size:
            _wait(requests)
            block = incoming
    _wait(grad_requests)
    grad_k, grad_v = grad_block.split([dk, grad_block.shape[-1] - dk], dim=-1)
    return dq, grad_k, grad_v


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, keys_of, group: dist.ProcessGroup, kernel: BlockKernel):
        scale = 1.0 / math.sqrt(q.shape[-1])
        out, lse = ring_forward(Ring(group), q, k, v, keys_of, kernel, scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.keys_of, ctx.group, ctx.scale, ctx.kernel = keys_of, group, scale, kernel
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        merged_lse = finite_lse(lse)  # every query has a key somewhere in the row
        dq, grad_k, grad_v = ring_backward(
            Ring(ctx.group), grad_out, q, k, v, out, merged_lse, ctx.keys_of, ctx.kernel, ctx.scale
        )
        return dq.to(q.dtype), grad_k.to(k.dtype), grad_v.to(v.dtype), None, None, None


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    shard: TokenShard,
    group: dist.ProcessGroup,
    backend: str = "sdpa",
    sdpa_backend: str = "auto",
    query_chunk: int = RING_QUERY_CHUNK,
    tiles: TiledShard | None = None,
) -> torch.Tensor:
    """Ring attention (see the module docstring). Each block goes through the fused kernel that
    `vidforge.parallel.attention_blocks.block_kernel` picks for `backend`, `sdpa_backend` and q (the CPU
    flash kernel here; SDPA's flash, efficient or cuDNN op, or flash-attn, on CUDA), which returns the
    block's log-sum-exp for the merge; `backend="dense"` runs the einsum reference instead, `query_chunk`
    queries at a time. Plain and packed rows take the same kernels (see `BlockKeys`). `tiles`:
    sliding-tile attention's windows, each block under its part of the mask (`TiledShard.block`) on the
    einsum kernel (exact on any device; the fused kernels take no mask), blocks no window reaches
    skipped."""
    if shard.size == 1:
        return all_gather_attention(q, k, v, shard, group, backend, sdpa_backend, tiles=tiles)
    kernel = block_kernel(backend, sdpa_backend, q, query_chunk, masked=tiles is not None)
    return _RingAttention.apply(q, k, v, _keys_of(shard, tiles, q.device), group, kernel)


CP_ATTENTION = {
    "all-gather": all_gather_attention,
    "ring": ring_attention,
    "ulysses": ulysses_attention,
}
