"""The one attention dispatcher every attention layer calls.

Tensor layout: q, k and v are (B, S, heads, head_dim) ("BSHD", what a Linear followed by a view gives
and what flash-attn takes); the output has the query's shape. Which keys a query may see is described
by one of:

- `None`: every key (a plain batch of equal-length sequences);
- `KeyPadding(mask)`: a (B, S_kv) boolean mask of valid keys (text tokens padded to one length);
- `Segments(q_lens, kv_lens)`: packed sequences in one row (B = 1): query segment i sees only key
  segment i. Self-attention over packed samples, per-frame (spatial) and per-position (temporal)
  attention of ST-DiT, and cross-attention of packed samples to their own captions are all this.
- `TileMask`: sliding-tile attention (`vidforge.attention.sliding_tile`): FlexAttention's block mask under
  `flex`, the exact masked reference under `sdpa` and `dense`; `TileRows` the same for some queries of
  a row against all of it (context parallel's all-gather and Ulysses); `TileSelection` the same for
  video sparse attention's fine pass (`vidforge.attention.video_sparse`).

Backends (`model.attention`): `sdpa` (torch SDPA; packed segments run as batched SDPA calls over runs
of equal-length segments, so no work is spent on masked blocks; which SDPA kernel each call may use is
`sdpa_kernels`' decision), `dense` (explicit mask and softmax;
the slow reference that runs anywhere), `flex` (FlexAttention with a document mask; compiled on GPU,
eager forward on CPU), `flash` (flash-attn, varlen for packed or padded inputs). Context parallelism
wraps `Attend` modules from outside; the mask objects carry the host-side lengths it needs, and a
`ContextShard` mask (this rank's share of a row split over cp ranks) is only understood by it.
"""

from __future__ import annotations

import functools
import math
import warnings
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import nn

from vidforge.attention.sliding_tile import TileMask, TileRows, check_backend
from vidforge.attention.video_sparse import TileSelection
from vidforge.errors import UserInputError
from vidforge.tokens.masks import KeyPadding, Segments
from vidforge.tokens.shard import ContextShard

BACKENDS = ("sdpa", "dense", "flex", "flash")
SDPA_BACKENDS = ("auto", "cudnn", "flash", "efficient", "math")


AttentionMask = KeyPadding | Segments | TileMask | TileRows | TileSelection | ContextShard | None


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: AttentionMask = None,
    backend: str = "sdpa",
    sdpa_backend: str = "auto",
) -> torch.Tensor:
    """Softmax attention with scale 1/sqrt(head_dim). q: (B, S_q, H, D); k, v: (B, S_kv, H, D); returns
    (B, S_q, H, D). See the module docstring for `mask` and `backend`."""
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(
            f"attention takes (B, S, heads, head_dim) tensors, got {tuple(q.shape)}, {tuple(k.shape)}"
        )
    if isinstance(mask, ContextShard):
        raise ValueError(
            f"{mask.scope} attention over a context-parallel shard needs the keys of every cp rank: install "
            "context-parallel attention with vidforge.parallel.context_parallel.apply_cp"
        )
    if isinstance(mask, Segments):
        if q.shape[0] != 1 or q.shape[1] != mask.total_q or k.shape[1] != mask.total_kv:
            raise ValueError(
                f"packed Segments need one row holding {mask.total_q} queries and {mask.total_kv} keys, "
                f"got q {tuple(q.shape)} and k {tuple(k.shape)}"
            )
    if isinstance(mask, TileMask | TileRows | TileSelection):  # tiles: block mask, or masked reference
        check_backend(backend)
        return _flex(q, k, v, mask) if backend == "flex" else mask.reference(q, k, v)
    if backend == "sdpa":
        return _sdpa(q, k, v, mask, sdpa_backend)
    if backend == "dense":
        return _dense(q, k, v, mask)
    if backend == "flex":
        return _flex(q, k, v, mask)
    if backend == "flash":
        return _flash(q, k, v, mask)
    raise UserInputError(f"model.attention: unknown backend {backend!r}; use one of {', '.join(BACKENDS)}")


class Attend(nn.Module):
    """A parameter-free module around `attention`, one per attention layer, so that parallelism code can
    find and replace it (context parallel wraps it with its K/V exchange) without touching the layer."""

    def __init__(self, backend: str = "sdpa", sdpa_backend: str = "auto") -> None:
        super().__init__()
        if backend not in BACKENDS:
            raise UserInputError(
                f"model.attention: unknown backend {backend!r}; use one of {', '.join(BACKENDS)}"
            )
        if sdpa_backend not in SDPA_BACKENDS:
            raise UserInputError(
                f"model.sdpa_backend: unknown {sdpa_backend!r}; use one of {', '.join(SDPA_BACKENDS)}"
            )
        self.backend = backend
        self.sdpa_backend = sdpa_backend

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask = None
    ) -> torch.Tensor:
        return attention(q, k, v, mask, self.backend, self.sdpa_backend)

    def extra_repr(self) -> str:
        return f"backend={self.backend}" + (
            f", sdpa_backend={self.sdpa_backend}" if self.backend == "sdpa" else ""
        )


# --- sdpa -------------------------------------------------------------------------------------------


HOPPER = 9
"""Compute capability major of H100/H200, where `auto` puts cuDNN first."""
UNMASKED_ON_HOPPER = ("cudnn", "flash", "efficient", "math")
"""Fastest first, as measured on an H200 (torch 2.11, forward+backward at 32K tokens): cuDNN 535, flash
322, efficient 138 TFLOP/s. A kernel that refuses a call (cuDNN and flash take no fp32) passes it on."""
MASKED = ("efficient", "cudnn", "math")
"""For a call with a key-padding mask: kernels that take one. Memory-efficient first: it takes a mask on
every CUDA GPU and torch version vidforge supports (cuDNN's passed the GPU suite on torch 2.11)."""
TAKES_MASK = frozenset(MASKED)

_said: set[str] = set()


def sdpa_kernels(
    sdpa_backend: str, capability: tuple[int, int] | None, masked: bool
) -> tuple[str, ...] | None:
    """The SDPA kernels one call may use, in priority order, or None for torch's own choice: off CUDA
    (`capability` None; a CPU has one kernel per case) and under `auto` off Hopper. `auto` on Hopper puts
    the fastest measured kernel first for unmasked calls (`UNMASKED_ON_HOPPER`); a masked call gets
    the kernels that take a mask (`MASKED`), under `auto` and when the forced kernel takes none (flash)."""
    if capability is None:
        return None
    if masked and (sdpa_backend == "auto" or sdpa_backend not in TAKES_MASK):
        return MASKED
    if sdpa_backend == "auto":
        return UNMASKED_ON_HOPPER if capability[0] == HOPPER else None
    return (sdpa_backend,)


def _capability(device: torch.device) -> tuple[int, int] | None:
    if device.type != "cuda":
        return None
    props = torch.cuda.get_device_properties(device)  # dynamo constant-folds this call
    return props.major, props.minor


def say_fallback(sdpa_backend: str, kernels: tuple[str, ...] | None) -> None:
    """Say once per forced kernel that masked calls run elsewhere (`sdpa_kernels` gave `MASKED` for a
    kernel that takes no mask). Called before the kernel context is made: torch.compile traces it whole
    that way (saying it from the function that makes the context defeats dynamo's sdpa_kernel support)."""
    if kernels == MASKED and sdpa_backend not in ("auto", *TAKES_MASK) and sdpa_backend not in _said:
        _said.add(sdpa_backend)
        warnings.warn(
            f"model.sdpa_backend={sdpa_backend}: that kernel takes no attention mask; calls with one "
            f"(captions padded to one length) run on {' / '.join(MASKED)} instead",
            stacklevel=4,
        )


def sdpa_context(kernels: tuple[str, ...] | None):
    """Torch's SDPA kernel selection for `sdpa_kernels`' answer: those kernels enabled, in that priority
    (None: torch's own)."""
    if kernels is None:
        return nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    by_name = {
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
    }
    return sdpa_kernel([by_name[k] for k in kernels], set_priority=True)


def _sdpa_bshd(q, k, v, attn_mask=None):
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=attn_mask
    )
    return out.transpose(1, 2)


def _sdpa(q, k, v, mask, sdpa_backend):
    kernels = sdpa_kernels(sdpa_backend, _capability(q.device), masked=isinstance(mask, KeyPadding))
    say_fallback(sdpa_backend, kernels)
    with sdpa_context(kernels):
        if mask is None:
            return _sdpa_bshd(q, k, v)
        if isinstance(mask, KeyPadding):
            return _sdpa_bshd(q, k, v, mask.mask[:, None, None, :])
        # Packed: one batched call per run of equal-length segments, each unmasked; no FLOPs spent
        # across samples. The runs tile the row in order, so the row is split (its backward is one cat)
        # rather than indexed (each index's backward writes a zero tensor of the whole row), and a row
        # that is one run is not split at all.
        runs = mask.runs()
        heads, dim, v_dim = q.shape[2], q.shape[3], v.shape[3]
        rows = [t.flatten(0, 1) for t in (q, k, v)]  # (S, heads, dim) views
        if len(runs) == 1:
            pieces = [(rows[0], rows[1], rows[2])]
        else:
            q_sizes = [count * q_len for _, _, count, q_len, _ in runs]
            kv_sizes = [count * kv_len for _, _, count, _, kv_len in runs]
            pieces = list(
                zip(rows[0].split(q_sizes), rows[1].split(kv_sizes), rows[2].split(kv_sizes), strict=True)
            )
        outs = []
        for (qs, ks, vs), (_, _, count, q_len, kv_len) in zip(pieces, runs, strict=True):
            out = _sdpa_bshd(
                qs.reshape(count, q_len, heads, dim),
                ks.reshape(count, kv_len, heads, dim),
                vs.reshape(count, kv_len, heads, v_dim),
            )
            outs.append(out.reshape(count * q_len, heads, v_dim))
        return (outs[0] if len(outs) == 1 else torch.cat(outs)).unsqueeze(0)


# --- dense ------------------------------------------------------------------------------------------


def _dense(q, k, v, mask):
    """Explicit scores, mask and softmax (in float32, or float64 for float64 inputs)."""
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    scores = torch.einsum("bqhd,bkhd->bhqk", q.to(compute), k.to(compute)) / math.sqrt(q.shape[-1])
    if isinstance(mask, KeyPadding):
        allowed = mask.mask[:, None, None, :]
    elif isinstance(mask, Segments):
        q_doc, kv_doc = mask.document_ids(q.device)
        allowed = (q_doc[:, None] == kv_doc[None, :])[None, None]
    else:
        allowed = None
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("bhqk,bkhd->bqhd", probs, v.to(compute))
    return out.to(q.dtype)


# --- flex -------------------------------------------------------------------------------------------


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def _flex_block_mask(mask, batch, q_len, kv_len, device):
    from torch.nn.attention.flex_attention import create_block_mask

    if mask is None:
        return None
    if isinstance(mask, TileMask | TileRows | TileSelection):
        return mask.block_mask(device)
    key = ("flex", str(device), batch, q_len, kv_len)
    if key in mask._cache:
        return mask._cache[key]
    if isinstance(mask, KeyPadding):
        valid = mask.mask

        def mask_mod(b, h, q_idx, kv_idx):
            return valid[b, kv_idx]

        block = create_block_mask(mask_mod, batch, None, q_len, kv_len, device=device)
    else:
        q_doc, kv_doc = mask.document_ids(device)

        def mask_mod(b, h, q_idx, kv_idx):
            return q_doc[q_idx] == kv_doc[kv_idx]

        block = create_block_mask(mask_mod, None, None, q_len, kv_len, device=device)
    mask._cache[key] = block
    return block


def _flex(q, k, v, mask):
    try:
        from torch.nn.attention.flex_attention import flex_attention
    except ImportError as err:  # pragma: no cover - torch >= 2.5 has it
        raise UserInputError("model.attention=flex needs torch >= 2.5; use sdpa") from err
    block_mask = _flex_block_mask(mask, q.shape[0], q.shape[1], k.shape[1], q.device)
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if q.device.type == "cuda":
        out = _compiled_flex()(qt, kt, vt, block_mask=block_mask)
    else:
        # Eager FlexAttention materialises the scores; fine for CPU tests, and it warns about exactly that.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
            out = flex_attention(qt, kt, vt, block_mask=block_mask)
    return out.transpose(1, 2)


# --- flash-attn -------------------------------------------------------------------------------------


def flash_attn_available() -> bool:
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


def _flash(q, k, v, mask):
    try:
        from flash_attn import flash_attn_func, flash_attn_varlen_func
    except ImportError as err:
        raise UserInputError(
            "model.attention=flash needs the flash-attn package (pip install 'vidforge[gpu]'); use sdpa"
        ) from err
    if q.device.type != "cuda" or q.dtype not in (torch.float16, torch.bfloat16):
        raise UserInputError(
            f"model.attention=flash runs on CUDA in fp16/bf16, got {q.device.type} {q.dtype}; use autocast or sdpa"
        )
    if mask is None:
        return flash_attn_func(q, k, v)
    if isinstance(mask, Segments):
        cu_q, cu_kv = mask.cu_seqlens(q.device)
        out = flash_attn_varlen_func(q[0], k[0], v[0], cu_q, cu_kv, mask.max_q, mask.max_kv)
        return out.unsqueeze(0)
    # Key padding: queries are all valid; drop padded keys and run varlen with one segment per row.
    batch, q_len = q.shape[:2]
    lens = mask.mask.sum(dim=1, dtype=torch.int32)
    cu_kv = F.pad(lens.cumsum(0, dtype=torch.int32), (1, 0))
    cu_q = torch.arange(0, (batch + 1) * q_len, q_len, dtype=torch.int32, device=q.device)
    out = flash_attn_varlen_func(
        q.reshape(batch * q_len, *q.shape[2:]), k[mask.mask], v[mask.mask], cu_q, cu_kv, q_len, k.shape[1]
    )
    return out.reshape(q.shape[0], q_len, *out.shape[1:])
