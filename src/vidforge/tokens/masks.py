"""Which keys a query may see, as host-side data the attention dispatcher (`vidforge.attention.dispatch`)
and the context-parallel code read: padding of captions, and block-diagonal segments of packed samples."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


@dataclass(eq=False)
class KeyPadding:
    """Valid keys per batch row: `mask` is (B, S_kv) bool, True where the key may be attended to. Every
    row needs at least one valid key (the model's null text embedding guarantees that)."""

    mask: torch.Tensor
    _cache: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.mask.ndim != 2 or self.mask.dtype != torch.bool:
            raise ValueError(
                f"KeyPadding.mask must be a (B, S_kv) bool tensor, got {self.mask.dtype} {tuple(self.mask.shape)}"
            )


@dataclass(eq=False)
class Segments:
    """Block-diagonal attention over packed sequences in one row: query tokens
    [cu_q[i], cu_q[i+1]) attend only to key tokens [cu_kv[i], cu_kv[i+1]). Self-attention passes the
    same lengths twice. Lengths are host integers (a packing plan is host data), so backends can group
    and slice without synchronising with the device."""

    q_lens: tuple[int, ...]
    kv_lens: tuple[int, ...]
    _cache: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.q_lens = tuple(int(n) for n in self.q_lens)
        self.kv_lens = tuple(int(n) for n in self.kv_lens)
        if len(self.q_lens) != len(self.kv_lens) or not self.q_lens:
            raise ValueError(
                f"Segments need as many key as query segments (>= 1), got {len(self.q_lens)} and {len(self.kv_lens)}"
            )
        if min(self.q_lens) < 1 or min(self.kv_lens) < 1:
            raise ValueError("Segments: every segment needs at least one query and one key token")
        self._runs = _equal_runs(self.q_lens, self.kv_lens)

    @classmethod
    def self_attention(cls, lens: Sequence[int]) -> Segments:
        return cls(tuple(lens), tuple(lens))

    @property
    def total_q(self) -> int:
        return sum(self.q_lens)

    @property
    def total_kv(self) -> int:
        return sum(self.kv_lens)

    @property
    def max_q(self) -> int:
        return max(self.q_lens)

    @property
    def max_kv(self) -> int:
        return max(self.kv_lens)

    def cu_seqlens(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Cumulative offsets (N+1,) int32 of queries and keys, as flash-attn varlen takes them."""
        key = ("cu", str(device))
        if key not in self._cache:
            q = torch.tensor((0, *self.q_lens), dtype=torch.int32, device=device).cumsum(0, dtype=torch.int32)
            kv = torch.tensor((0, *self.kv_lens), dtype=torch.int32, device=device).cumsum(
                0, dtype=torch.int32
            )
            self._cache[key] = (q, kv)
        return self._cache[key]

    def document_ids(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Segment index of every query token and every key token."""
        key = ("doc", str(device))
        if key not in self._cache:
            n = len(self.q_lens)
            ids = torch.arange(n, device=device)
            q = torch.repeat_interleave(ids, torch.tensor(self.q_lens, device=device))
            kv = torch.repeat_interleave(ids, torch.tensor(self.kv_lens, device=device))
            self._cache[key] = (q, kv)
        return self._cache[key]

    def runs(self) -> list[tuple[int, int, int, int, int]]:
        """Consecutive segments of equal (q_len, kv_len) grouped: (q_start, kv_start, count, q_len, kv_len).
        Packed samples have one run each for self-attention, and one per sample for ST-DiT's frames and
        positions, so SDPA runs a handful of batched calls rather than one per segment. Computed when the
        mask is made: a compiled block only reads it (a cache filled inside a checkpointed block is a side
        effect torch.compile refuses, and it broke the graph of every recomputed block)."""
        return self._runs

    def prepare(self, device: torch.device) -> None:
        """Fill the device tensors the flash and flex backends read (`cu_seqlens`, `document_ids`) before
        the blocks run, for the same reason `runs` is computed up front."""
        self.cu_seqlens(device)
        self.document_ids(device)


def _equal_runs(q_lens: tuple[int, ...], kv_lens: tuple[int, ...]) -> list[tuple[int, int, int, int, int]]:
    runs: list[list[int]] = []
    q_start = kv_start = 0
    for ql, kl in zip(q_lens, kv_lens, strict=True):
        if runs and runs[-1][3] == ql and runs[-1][4] == kl:
            runs[-1][2] += 1
        else:
            runs.append([q_start, kv_start, 1, ql, kl])
        q_start += ql
        kv_start += kl
    return [tuple(r) for r in runs]
