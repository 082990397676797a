"""One ring step's attention: this rank's queries against one block of keys. The forward returns the
block's output with its log-sum-exp; the backward takes the gradient of the merged output with the
merged output and log-sum-exp (the flash-attention backward of a block, given the final statistics,
is exactly that block's share of the gradients) and returns the gradients of the queries and of the
block's keys and values. That is all `vidforge.parallel.cp_attention.ring_attention` asks of a kernel.

Which keys a query sees in a block (`BlockKeys`): a ring block has the queries' own layout (a
`TokenShard`: each sample's piece, its real tokens first and its pads after), so query segment i sees a
prefix of the same positions, the source rank's real tokens of sample i. That needs no mask, only
slicing: neighbouring segments of equal (queries, keys) lengths run as one batched call (`runs`), as
the dispatcher runs packed `Segments`, and a segment without keys in the block (a sample with fewer
tokens than the ring has ranks) is skipped, with output 0 and log-sum-exp -inf. So no fused kernel is
handed a mask or a bias, plain and packed rows take the same kernels, and full attention needs no causal
block (is_causal=False throughout). Joint attention's blocks (a rank's video tokens, or the caption,
against queries of both) are no segment of the queries' layout: every query sees a prefix of the block
(`PrefixKeys`), the keys sliced.

Kernels, in the order `block_kernel` picks them:

1. `model.attention=dense`, or sdpa_backend=math, or float64 on CUDA (no fused CUDA kernel takes it),
   or blocks with an explicit mask (`MaskedKeys`: sliding-tile attention's windows): `einsum`, explicit
   scores and softmax in float32 (float64 for float64 inputs), `query_chunk` queries at a time, under
   a dense mask (built from the segments, or the one given). The reference the tests hold the fused
   kernels to.
2. `model.attention=flash`: flash-attn's `flash_attn_func(..., return_attn_probs=True)` and its
   `_flash_attn_backward` (CUDA, fp16/bf16), refused when the package is missing, as the dispatcher
   does. GPU: not run.
3. On the CPU: `aten._scaled_dot_product_flash_attention_for_cpu` and its backward (every float dtype).
4. On CUDA, by `model.sdpa_backend`: cudnn, flash or efficient picks that SDPA op and its backward;
   auto takes SDPA's flash kernel for fp16/bf16 with head_dim a multiple of 8 up to 256, else the
   memory-efficient one. GPU: not run.

`model.attention=flex` rings through the SDPA ops like sdpa (FlexAttention has no CPU backward).
Outputs, log-sum-exps (natural log, (B, H, Lq)) and gradients come back in the compute dtype (float32,
float64 for float64 inputs), which the ring merges and accumulates in.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from vidforge.errors import UserInputError

aten = torch.ops.aten


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """What the ring merges and accumulates in: float64 for float64 inputs, float32 otherwise."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


# --- which keys each query sees -------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """`count` neighbouring segments of `q_len` queries each, from query `start`: segment j holds the
    queries [start + j q_len, start + (j+1) q_len) and sees the first `kv_len` keys of the same
    positions in the block."""

    start: int
    count: int
    q_len: int
    kv_len: int

    @property
    def end(self) -> int:
        return self.start + self.count * self.q_len


@dataclass(frozen=True)
class BlockKeys:
    """Segment i of the queries (q_lens[i] of them, in order) sees the first kv_lens[i] keys of the same
    positions in the block; kv_lens[i] may be 0 (none)."""

    q_lens: tuple[int, ...]
    kv_lens: tuple[int, ...]

    @property
    def length(self) -> int:
        return sum(self.q_lens)

    def runs(self) -> tuple[Run, ...]:
        """Neighbouring segments of equal lengths grouped; segments without keys left out."""
        return _runs(self.q_lens, self.kv_lens)

    def allowed(self, device: torch.device) -> torch.Tensor:
        """(L, L) bool: which key of the block each query sees (the einsum kernel's mask)."""
        segment = torch.repeat_interleave(torch.arange(len(self.q_lens)), torch.tensor(self.q_lens))
        within = torch.cat([torch.arange(n) for n in self.q_lens])
        key_ok = within < torch.tensor(self.kv_lens)[segment]
        return ((segment[:, None] == segment[None, :]) & key_ok[None, :]).to(device)


@dataclass(frozen=True, eq=False)
class MaskedKeys:
    """Which key of the block each query sees by an explicit rule (sliding-tile attention's windows under
    ring attention, `TiledShard.block`): `rows(queries)` is the (chunk, Lk) boolean mask of a slice of
    the queries, built per query chunk so that no (Lq, Lk) mask is held; a query may see none. Only the
    einsum kernel takes it."""

    rows: Callable[[slice], torch.Tensor]


@dataclass(frozen=True)
class PrefixKeys:
    """Every query sees the first `count` keys of the block, whatever its length, the queries' layout
    aside: joint attention (`vidforge.parallel.joint_attention`), whose queries are video and caption
    tokens and whose blocks are a rank's video tokens or the caption. No mask: the fused kernels take
    the keys sliced."""

    count: int


_EVERY_KEY = MaskedKeys(lambda rows: torch.ones((1, 1), dtype=torch.bool))
"""The einsum kernel's mask for a block whose every key every query sees (broadcast over the scores)."""


@functools.lru_cache(maxsize=4096)  # packed rows differ step to step: bounded
def _runs(q_lens: tuple[int, ...], kv_lens: tuple[int, ...]) -> tuple[Run, ...]:
    runs: list[Run] = []
    start = 0
    for q_len, kv_len in zip(q_lens, kv_lens, strict=True):
        last = runs[-1] if runs else None
        if kv_len and last and last.end == start and (last.q_len, last.kv_len) == (q_len, kv_len):
            runs[-1] = Run(last.start, last.count + 1, q_len, kv_len)
        elif kv_len:
            runs.append(Run(start, 1, q_len, kv_len))
        start += q_len
    return tuple(runs)


def _segments(x: torch.Tensor, run: Run, length: int | None = None) -> torch.Tensor:
    """(B, L, H, D) -> the run's segments as a batch (B * count, q_len or `length`, H, D)."""
    part = x[:, run.start : run.end].unflatten(1, (run.count, run.q_len))
    return (part if length is None else part[:, :, :length]).flatten(0, 1)


def _lse_segments(lse: torch.Tensor, run: Run) -> torch.Tensor:
    """(B, H, L) -> (B * count, H, q_len), contiguous (the kernels read it by its strides)."""
    part = lse[..., run.start : run.end].unflatten(2, (run.count, run.q_len))
    return part.transpose(1, 2).flatten(0, 1).contiguous()


# --- kernels --------------------------------------------------------------------------------------


class FusedKernel(Protocol):
    """A fused attention kernel over a batch of equal segments without a mask: q (N, Lq, H, D), k and
    v (N, Lk, H, D) (BSHD); `forward` gives (out (N, Lq, H, Dv), lse (N, H, Lq)), `backward` the
    gradients of q, k and v from the gradient of out, out and lse."""

    name: str

    def forward(self, q, k, v, scale: float) -> tuple[torch.Tensor, torch.Tensor]: ...

    def backward(self, dout, q, k, v, out, lse, scale: float) -> tuple[torch.Tensor, ...]: ...


def _bhsd(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """BSHD -> BHSD views (what the aten SDPA ops take)."""
    return [t.transpose(1, 2) for t in tensors]


class CpuFlash(FusedKernel):
    name = "cpu-flash"

    def forward(self, q, k, v, scale):
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(*_bhsd(q, k, v), scale=scale)
        return out.transpose(1, 2), lse

    def backward(self, dout, q, k, v, out, lse, scale):
        grads = aten._scaled_dot_product_flash_attention_for_cpu_backward(
            *_bhsd(dout, q, k, v, out), lse, 0.0, False, scale=scale
        )
        return [g.transpose(1, 2) for g in grads]


def _unused_dropout_state(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The dropout state the CUDA backward ops take; unread at dropout 0."""
    return torch.zeros(2, dtype=torch.int64, device=device), torch.zeros((), dtype=torch.int64, device=device)


class SdpaFlash(FusedKernel):
    name = "sdpa-flash"

    def forward(self, q, k, v, scale):
        out, lse, *_ = aten._scaled_dot_product_flash_attention(*_bhsd(q, k, v), scale=scale)
        return out.transpose(1, 2), lse

    def backward(self, dout, q, k, v, out, lse, scale):
        seed, offset = _unused_dropout_state(q.device)
        lq, lk = q.shape[1], k.shape[1]
        grads = aten._scaled_dot_product_flash_attention_backward(
            *_bhsd(dout, q, k, v, out), lse, None, None, lq, lk, 0.0, False, seed, offset, scale=scale
        )
        return [g.transpose(1, 2) for g in grads]


def _efficient_lse_length(length: int) -> int:
    """The memory-efficient kernel's log-sum-exp is padded to a multiple of 32 queries (not on ROCm)."""
    return length if torch.version.hip else -(-length // 32) * 32


class SdpaEfficient(FusedKernel):
    name = "sdpa-efficient"

    def forward(self, q, k, v, scale):
        out, lse, *_ = aten._scaled_dot_product_efficient_attention(*_bhsd(q, k, v), None, True, scale=scale)
        return out.transpose(1, 2), lse[..., : q.shape[1]]

    def backward(self, dout, q, k, v, out, lse, scale):
        lq = q.shape[1]
        padded = torch.nn.functional.pad(lse, (0, _efficient_lse_length(lq) - lq))
        seed, offset = (torch.zeros((), dtype=torch.int64) for _ in range(2))
        grads = aten._scaled_dot_product_efficient_attention_backward(
            *_bhsd(dout, q, k, v), None, out.transpose(1, 2), padded, seed, offset, 0.0,
            [True, True, True, False], False, scale=scale,
        )  # fmt: skip
        return [g.transpose(1, 2) for g in grads[:3]]


class SdpaCudnn(FusedKernel):
    """cuDNN's log-sum-exp is (B, H, L, 1) (torch >= 2.5); its backward is handed the same shape."""

    name = "sdpa-cudnn"

    def forward(self, q, k, v, scale):
        out, lse, *_ = aten._scaled_dot_product_cudnn_attention(*_bhsd(q, k, v), None, True, scale=scale)
        return out.transpose(1, 2), lse.squeeze(-1) if lse.ndim == 4 else lse

    def backward(self, dout, q, k, v, out, lse, scale):
        seed, offset = _unused_dropout_state(q.device)
        lq, lk = q.shape[1], k.shape[1]
        grads = aten._scaled_dot_product_cudnn_attention_backward(
            *_bhsd(dout, q, k, v, out), lse.unsqueeze(-1), seed, offset, None, None, None, lq, lk, 0.0,
            False, scale=scale,
        )  # fmt: skip
        return [g.transpose(1, 2) for g in grads[:3]]


class FlashAttn(FusedKernel):
    """flash-attn 2 (BSHD natively). Its backward is the package's internal `_flash_attn_backward`, whose
    parameters changed between releases (window_size split in two, softcap added): called by name."""

    name = "flash-attn"

    def forward(self, q, k, v, scale):
        from flash_attn import flash_attn_func

        out, lse, _ = flash_attn_func(q, k, v, softmax_scale=scale, return_attn_probs=True)
        return out, lse

    def backward(self, dout, q, k, v, out, lse, scale):
        from flash_attn.flash_attn_interface import _flash_attn_backward

        dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
        given = {
            "dout": dout.contiguous(), "q": q, "k": k, "v": v, "out": out.contiguous(), "softmax_lse": lse,
            "dq": dq, "dk": dk, "dv": dv, "dropout_p": 0.0, "softmax_scale": scale, "causal": False,
            "window_size": (-1, -1), "window_size_left": -1, "window_size_right": -1, "softcap": 0.0,
            "alibi_slopes": None, "deterministic": False, "rng_state": None,
        }  # fmt: skip
        names = inspect.signature(_flash_attn_backward).parameters
        _flash_attn_backward(**{name: value for name, value in given.items() if name in names})
        return dq, dk, dv


class Einsum:
    """The explicit reference (see the module docstring): whole block, a dense mask, `query_chunk`
    queries per score tensor (B, H, chunk, Lk), which for whole blocks of a long row would not fit."""

    name = "einsum"

    def __init__(self, query_chunk: int) -> None:
        self.query_chunk = query_chunk

    def chunks(self, length: int) -> list[slice]:
        return [slice(s, min(s + self.query_chunk, length)) for s in range(0, length, self.query_chunk)]


def finite_lse(lse: torch.Tensor) -> torch.Tensor:
    """-inf (no keys) as 0, so that exp(score - lse) stays finite."""
    return torch.where(torch.isinf(lse), torch.zeros((), dtype=lse.dtype, device=lse.device), lse)


BlockKernel = FusedKernel | Einsum


def block_kernel(
    backend: str, sdpa_backend: str, q: torch.Tensor, query_chunk: int = 2048, masked: bool = False
) -> BlockKernel:
    """The kernel a ring runs its blocks with for the model's attention settings and q's device, dtype
    and head size, in the order of the module docstring; `masked` (blocks of `MaskedKeys`): einsum."""
    cuda = q.device.type == "cuda"
    if masked or backend == "dense" or sdpa_backend == "math" or (cuda and q.dtype == torch.float64):
        return Einsum(query_chunk)
    if backend == "flash":
        from vidforge.attention.dispatch import flash_attn_available

        if not flash_attn_available() or not cuda or q.dtype not in (torch.float16, torch.bfloat16):
            raise UserInputError(
                "model.attention=flash under ring attention needs the flash-attn package on CUDA in "
                f"fp16/bf16 (got {q.device.type} {q.dtype}); use model.attention=sdpa"
            )
        return FlashAttn()
    if not cuda:
        return CpuFlash()
    if sdpa_backend == "cudnn":
        return SdpaCudnn()
    if sdpa_backend == "flash":
        return SdpaFlash()
    if sdpa_backend == "efficient":
        return SdpaEfficient()
    head_dim = q.shape[-1]
    if q.dtype in (torch.float16, torch.bfloat16) and head_dim % 8 == 0 and head_dim <= 256:
        return SdpaFlash()
    return SdpaEfficient()


# --- a block: forward and backward; the merge -----------------------------------------------------


def merge_partial(
    out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor, block_lse: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine two softmax-normalised partial outputs over disjoint key sets by their log-sum-exps
    (B, H, Lq): the result is the attention over the union. -inf (no keys yet) on either side is fine."""
    new_lse = torch.logaddexp(lse, block_lse)
    finite = finite_lse(new_lse)
    w_old = torch.exp(lse - finite).transpose(1, 2)[..., None]  # (B, Lq, H, 1)
    w_new = torch.exp(block_lse - finite).transpose(1, 2)[..., None]
    return out * w_old + block_out * w_new, new_lse


def attend_blocks(
    kernel: BlockKernel,
    q: torch.Tensor,
    blocks: list[tuple[torch.Tensor, torch.Tensor, BlockKeys]],
    grad_out: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """A ring's arithmetic in one process, without the sends: q against each (k, v, keys) block in turn,
    merged by log-sum-exp, then each block's backward from the merged output for the output gradient
    `grad_out`. Returns the output, dq, and every block's dk and dv (compute dtype). The kernels' tests
    run it (on the CPU and in the GPU suite)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    out = lse = None
    for k, v, keys in blocks:
        part = block_forward(kernel, q, k, v, keys, scale)
        out, lse = part if out is None else merge_partial(out, lse, *part)
    dq, dks, dvs = 0, [], []
    for k, v, keys in blocks:
        dq_b, dk_b, dv_b = block_backward(kernel, grad_out, q, k, v, out, finite_lse(lse), keys, scale)
        dq, dks, dvs = dq + dq_b, [*dks, dk_b], [*dvs, dv_b]
    return out, dq, dks, dvs


def block_forward(
    kernel: BlockKernel,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    keys: BlockKeys | MaskedKeys | PrefixKeys,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of q (B, L, H, D) to the block k, v (B, L, H, D) where `keys` allows: the
    block-normalised output (B, L, H, Dv) and its log-sum-exp (B, H, L), in the compute dtype. A query
    with no key in the block gets output 0 and log-sum-exp -inf."""
    if isinstance(keys, PrefixKeys):
        return _prefix_forward(kernel, q, k, v, keys.count, scale)
    if isinstance(kernel, Einsum):
        return _einsum_forward(kernel, q, k, v, keys, scale)
    if isinstance(keys, MaskedKeys):
        raise ValueError("a block of MaskedKeys runs on the einsum kernel (block_kernel(..., masked=True))")
    dtype = compute_dtype(q)
    runs = keys.runs()
    if len(runs) == 1 and runs[0].count == 1 and runs[0].q_len == q.shape[1]:  # one segment: all queries
        out, lse = kernel.forward(q, k[:, : runs[0].kv_len], v[:, : runs[0].kv_len], scale)
        return out.to(dtype), lse.to(dtype)
    b, length, heads = q.shape[:3]
    out = q.new_zeros((b, length, heads, v.shape[-1]), dtype=dtype)
    lse = q.new_full((b, heads, length), float("-inf"), dtype=dtype)
    for run in runs:
        part, part_lse = kernel.forward(
            _segments(q, run), _segments(k, run, run.kv_len), _segments(v, run, run.kv_len), scale
        )
        out[:, run.start : run.end] = part.unflatten(0, (b, run.count)).flatten(1, 2)
        lse[..., run.start : run.end] = part_lse.unflatten(0, (b, run.count)).transpose(1, 2).flatten(2)
    return out, lse


def block_backward(
    kernel: BlockKernel,
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    keys: BlockKeys | MaskedKeys | PrefixKeys,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """This block's share of the gradients, given the gradient `dout` (B, L, H, Dv) of the merged
    output `out` and the merged log-sum-exp `lse` (B, H, L, finite): dq (B, L, H, D) and the block's dk,
    dv (zero where no query sees the key), in the compute dtype."""
    if isinstance(keys, PrefixKeys):
        return _prefix_backward(kernel, dout, q, k, v, out, lse, keys.count, scale)
    if isinstance(kernel, Einsum):
        return _einsum_backward(kernel, dout, q, k, v, out, lse, keys, scale)
    if isinstance(keys, MaskedKeys):
        raise ValueError("a block of MaskedKeys runs on the einsum kernel (block_kernel(..., masked=True))")
    dtype = compute_dtype(q)
    dout, out = dout.to(q.dtype), out.to(q.dtype)  # the fused kernels take them in q's dtype
    dq = torch.zeros(q.shape, dtype=dtype, device=q.device)
    dk = torch.zeros(k.shape, dtype=dtype, device=k.device)
    dv = torch.zeros(v.shape, dtype=dtype, device=v.device)
    b = q.shape[0]
    for run in keys.runs():
        kv = run.kv_len
        grads = kernel.backward(
            _segments(dout, run),
            _segments(q, run),
            _segments(k, run, kv),
            _segments(v, run, kv),
            _segments(out, run),
            _lse_segments(lse, run),
            scale,
        )
        for full, grad, length in zip((dq, dk, dv), grads, (run.q_len, kv, kv), strict=True):
            place = full[:, run.start : run.end].unflatten(1, (run.count, run.q_len))[:, :, :length]
            place += grad.unflatten(0, (b, run.count))
    return dq, dk, dv


def _prefix_forward(kernel: BlockKernel, q, k, v, count: int, scale: float):
    """`block_forward` under `PrefixKeys(count)`: the kernel on the first `count` keys, all seen."""
    dtype = compute_dtype(q)
    if count == 0:
        out = q.new_zeros((*q.shape[:3], v.shape[-1]), dtype=dtype)
        return out, q.new_full((q.shape[0], q.shape[2], q.shape[1]), float("-inf"), dtype=dtype)
    k, v = k[:, :count], v[:, :count]
    if isinstance(kernel, Einsum):
        return _einsum_forward(kernel, q, k, v, _EVERY_KEY, scale)
    out, lse = kernel.forward(q, k, v, scale)
    return out.to(dtype), lse.to(dtype)


def _prefix_backward(kernel: BlockKernel, dout, q, k, v, out, lse, count: int, scale: float):
    """`block_backward` under `PrefixKeys(count)`: the keys past `count` get no gradient."""
    dtype = compute_dtype(q)
    dq = torch.zeros(q.shape, dtype=dtype, device=q.device)
    dk = torch.zeros(k.shape, dtype=dtype, device=k.device)
    dv = torch.zeros(v.shape, dtype=dtype, device=v.device)
    if count == 0:
        return dq, dk, dv
    seen = (k[:, :count], v[:, :count])
    if isinstance(kernel, Einsum):
        grads = _einsum_backward(kernel, dout, q, *seen, out, lse, _EVERY_KEY, scale)
    else:  # the fused kernels take dout and out in q's dtype, the log-sum-exp dense
        grads = kernel.backward(dout.to(q.dtype), q, *seen, out.to(q.dtype), lse.contiguous(), scale)
    dq += grads[0]
    dk[:, :count] += grads[1]
    dv[:, :count] += grads[2]
    return dq, dk, dv


def block_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The einsum kernel's arithmetic: attention of q (B, Lq, H, D) to keys (B, Lk, H, D) where `allowed`
    (Lq, Lk) is True, giving the block-normalised output (B, Lq, H, Dv) and its log-sum-exp (B, H, Lq) in
    q's dtype. A query with no allowed key gets output 0 and log-sum-exp -inf."""
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    scores = scores.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - finite_lse(lse)[..., None])
    return torch.einsum("bhqk,bkhd->bqhd", probs, v), lse


def _chunk_masks(kernel: Einsum, keys: BlockKeys | MaskedKeys, q: torch.Tensor):
    """(query slice, its (chunk, Lk) mask) for each of the einsum kernel's query chunks."""
    full = keys.allowed(q.device) if isinstance(keys, BlockKeys) else None
    for rows in kernel.chunks(q.shape[1]):
        yield rows, full[rows] if full is not None else keys.rows(rows).to(q.device)


def _einsum_forward(kernel: Einsum, q, k, v, keys: BlockKeys | MaskedKeys, scale):
    dtype = compute_dtype(q)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    out = q.new_zeros((*q.shape[:3], v.shape[-1]))
    lse = q.new_full((q.shape[0], q.shape[2], q.shape[1]), float("-inf"))
    tiled = isinstance(keys, MaskedKeys)  # only a tile window leaves a chunk without keys: test it there
    for rows, allowed in _chunk_masks(kernel, keys, q):  # (.any() waits for the device)
        if not tiled or allowed.any():  # a chunk without keys here keeps output 0, log-sum-exp -inf
            out[:, rows], lse[..., rows] = block_attention(q[:, rows], k, v, allowed, scale)
    return out, lse


def _einsum_backward(kernel: Einsum, dout, q, k, v, out, lse, keys: BlockKeys | MaskedKeys, scale):
    dtype = compute_dtype(q)
    q, k, v, dout = q.to(dtype), k.to(dtype), v.to(dtype), dout.to(dtype)
    delta = (dout * out.to(dtype)).sum(-1).transpose(1, 2)  # (B, H, L): rowsum(dO * O)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    tiled = isinstance(keys, MaskedKeys)
    for rows, allowed in _chunk_masks(kernel, keys, q):
        if tiled and not allowed.any():
            continue
        scores = torch.einsum("bqhd,bkhd->bhqk", q[:, rows], k) * scale
        probs = torch.exp(scores - lse[..., rows, None]).masked_fill(~allowed, 0.0)
        d_probs = torch.einsum("bqhd,bkhd->bhqk", dout[:, rows], v)
        d_scores = probs * (d_probs - delta[..., rows, None])
        dq[:, rows] += torch.einsum("bhqk,bkhd->bqhd", d_scores, k) * scale
        dk += torch.einsum("bhqk,bqhd->bkhd", d_scores, q[:, rows]) * scale
        dv += torch.einsum("bhqk,bqhd->bkhd", probs, dout[:, rows])
    return dq, dk, dv
