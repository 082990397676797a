"""`vidforge bench attention`: each attention backend of `vidforge.attention.dispatch` at the sequence
lengths of `bench.attention_seq_lens`, one sequence of the model's heads x head_dim, forward and
forward + backward, in TFLOP/s.

FLOPs count the two matrix products (QK^T and PV: 4 x S^2 x heads x head_dim forward) with the backward
at twice the forward, as `vidforge.models.flops` does for MFU; FlashAttention's papers count the
backward at 2.5x, so their TFLOP/s for the same time are 1.17x ours. A backend that cannot run here is
skipped with the reason (flash-attn not installed or no GPU; the dense reference beyond
`DENSE_LIMIT_BYTES` of scores); a forward or backward that raises (FlexAttention has no CPU backward)
is reported with its error.

Under several ranks (`--nproc N`, or torchrun), it times context-parallel attention instead: one row of
each length split over all N ranks (`TokenShard`), through ring attention with fused per-block kernels
(`ring`), the einsum ring (`ring-einsum`, the reference), all-gather and Ulysses (both through the
model's backend); the slowest rank's median, TFLOP/s of the whole row's attention over all ranks."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist

from vidforge.attention.dispatch import BACKENDS, attention, flash_attn_available
from vidforge.bench.timing import slowest_rank, time_calls
from vidforge.parallel.cp_attention import CP_ATTENTION
from vidforge.parallel.runtime import init_runtime
from vidforge.profile import RunProfile
from vidforge.tokens import TokenShard

DENSE_LIMIT_BYTES = 2 * 2**30  # the dense reference materialises heads x S x S float32 scores (twice)


@dataclass
class AttentionRow:
    backend: str
    seq_len: int
    forward_s: float | None = None
    forward_backward_s: float | None = None
    forward_tflops: float | None = None
    forward_backward_tflops: float | None = None
    skipped: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def attention_flops(seq_len: int, heads: int, head_dim: int) -> int:
    """Forward FLOPs of full attention over one sequence: QK^T and PV, 2 x S x S x head_dim each per head."""
    return 4 * seq_len * seq_len * heads * head_dim


def unavailable(backend: str, seq_len: int, heads: int, device: torch.device) -> str | None:
    if backend == "flash" and not flash_attn_available():
        return "flash-attn is not installed or no CUDA GPU is visible (pip install 'vidforge[gpu]' on a GPU machine)"
    if backend == "dense" and 2 * heads * seq_len * seq_len * 4 > DENSE_LIMIT_BYTES:
        return f"the dense reference would hold {2 * heads * seq_len**2 * 4 / 2**30:.1f} GiB of scores"
    return None


def measure(row: AttentionRow, profile: RunProfile, device: torch.device, dtype: torch.dtype) -> AttentionRow:
    """Fill `row` with the backend's forward and forward + backward times at its sequence length."""
    backend, sdpa_backend = row.backend, profile.model.sdpa_backend

    def attend(q, k, v):
        return attention(q, k, v, None, backend, sdpa_backend)

    return _time(row, attend, row.seq_len, profile, device, dtype)


def _time(
    row: AttentionRow, attend, local: int, profile: RunProfile, device, dtype, group=None
) -> AttentionRow:
    """Forward and forward + backward times of `attend(q, k, v)` on (1, local, heads, head_dim) inputs,
    with the TFLOP/s of full attention over row.seq_len tokens; the slowest of `group`'s ranks when
    given."""
    heads, head_dim, bench = profile.model.heads, profile.model.head_dim, profile.bench
    shape = (1, local, heads, head_dim)
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v, grad = (torch.randn(shape, generator=g, device=device, dtype=dtype) for _ in range(4))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]

    def forward() -> None:
        with torch.no_grad():
            attend(q, k, v)

    def forward_backward() -> None:
        attend(*leaves).backward(grad)
        for t in leaves:
            t.grad = None

    flops = attention_flops(row.seq_len, heads, head_dim)
    try:
        fwd = slowest_rank(time_calls(forward, bench.warmup, bench.repeats, device).median, device, group)
    except (RuntimeError, ValueError, NotImplementedError) as err:
        row.skipped = f"forward: {type(err).__name__}: {str(err).splitlines()[0][:200]}"
        return row
    row.forward_s, row.forward_tflops = fwd, flops / fwd / 1e12
    try:
        both = slowest_rank(
            time_calls(forward_backward, bench.warmup, bench.repeats, device).median, device, group
        )
    except (RuntimeError, ValueError, NotImplementedError) as err:
        row.skipped = f"backward: {type(err).__name__}: {str(err).splitlines()[0][:200]}"
        return row
    row.forward_backward_s, row.forward_backward_tflops = both, 3 * flops / both / 1e12
    return row


CP_IMPLS = ("ring", "ring-einsum", "all-gather", "ulysses")
"""What `bench attention` compares under several ranks; ring-einsum is the ring with model.attention=dense."""


def measure_cp(
    row: AttentionRow, profile: RunProfile, group: dist.ProcessGroup, device, dtype
) -> AttentionRow:
    """Fill `row` (backend: one of CP_IMPLS) with its times over `group`: a row of row.seq_len tokens,
    split over the group's ranks. Every rank of the group calls this with the same row."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    heads = profile.model.heads
    if row.backend == "ulysses" and heads % size:
        row.skipped = f"ulysses splits the {heads} heads over {size} ranks: needs heads divisible by ranks"
        return row
    shard = TokenShard.of_grid((row.seq_len, 1, 1), rank, size)
    impl = "ring" if row.backend == "ring-einsum" else row.backend
    backend = "dense" if row.backend == "ring-einsum" else profile.model.attention
    sdpa_backend = profile.model.sdpa_backend

    def attend(q, k, v):
        return CP_ATTENTION[impl](q, k, v, shard, group, backend, sdpa_backend)

    return _time(row, attend, shard.local, profile, device, dtype, group)


def run(profile: RunProfile) -> dict[str, Any]:
    device = init_runtime(profile).device
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    heads = profile.model.heads
    ranks = dist.get_world_size() if dist.is_initialized() else 1
    rows = []
    if ranks > 1:  # the whole world as one context-parallel group
        for impl in CP_IMPLS:
            for seq_len in profile.bench.attention_seq_lens:
                rows.append(measure_cp(AttentionRow(impl, seq_len), profile, dist.group.WORLD, device, dtype))
    else:
        for backend in BACKENDS:
            for seq_len in profile.bench.attention_seq_lens:
                row = AttentionRow(backend, seq_len)
                row.skipped = unavailable(backend, seq_len, heads, device)
                rows.append(row if row.skipped else measure(row, profile, device, dtype))
    return {
        "profile": profile.name,
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "heads": heads,
        "head_dim": profile.model.head_dim,
        "ranks": ranks,
        "rows": [r.as_dict() for r in rows],
    }
