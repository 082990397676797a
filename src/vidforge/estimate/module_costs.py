"""Costs read off the family's network: one block (and what runs outside the blocks) is run on the meta
device, where no memory is allocated and nothing is computed, so a 14B model at 75K tokens runs in a
fraction of a second:

- FLOPs: torch's `FlopCounterMode` over a forward and a backward, attributed per module (the block's,
  its `Attend` modules' (QK^T and PV), and the rest, outside the blocks). Attention runs on the `dense`
  backend, whose explicit matmuls FlopCounterMode counts as a GPU's fused kernels' useful work (2 x 2 x
  d per (query, key) pair; the backward 2x), the convention of MFU.
- Bytes saved for the backward: `saved_tensors_hooks` while the block runs, each storage once (views
  and tensors several ops save count once), parameters not counted. Attention runs as FlashAttention
  (`aten._scaled_dot_product_flash_attention`, whose meta kernel gives the shapes the GPU's would:
  q, k, v, the output and a float32 log-sum-exp per head and token), not the math fallback a meta
  tensor would otherwise take (which keeps the S x S probabilities).

The network is built with one block: every block of a family is the same module (per-layer differences,
sliding-tile windows or video sparse attention, are counted by `models.flops` from their attended pairs),
so the model's cost is the outside once plus `layers` x the block. Results are cached per (model
section, token grid, caption and image tokens, noise level per token, dtype, LoRA)."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from vidforge.models.flops import first_block, meta_inputs, meta_key, meta_network, one_block
from vidforge.profile.model import Model
from vidforge.tokens import Grid


class _FlashOnMeta(TorchFunctionMode):
    """SDPA as FlashAttention's kernel, whose meta implementation gives the tensors the GPU's saves."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # a key-padding mask changes no saved shape: flash's varlen kernel keeps the same tensors
        if func is F.scaled_dot_product_attention:
            q, k, v = args[:3]
            scale = kwargs.get("scale")
            return torch.ops.aten._scaled_dot_product_flash_attention(
                q, k, v, 0.0, bool(kwargs.get("is_causal", False)), False, scale=scale
            )[0]
        return func(*args, **kwargs)


def block_saved_bytes(
    cfg: Model, grid: Grid, text: int, image: int, token_levels: bool, dtype: torch.dtype
) -> int:
    """Bytes one block saves for its backward on one sample, read with saved-tensor hooks on the meta
    device (attention as FlashAttention; each storage once; no parameter)."""
    key = meta_key(cfg, attention="sdpa", sdpa_backend="auto")
    return _block_saved_bytes(key, tuple(grid), text, image, token_levels, dtype)


@functools.lru_cache(maxsize=4096)
def _block_saved_bytes(
    key: str, grid: Grid, text: int, image: int, token_levels: bool, dtype: torch.dtype
) -> int:
    model = meta_network(key, dtype)
    cfg = one_block(key)
    _, block = first_block(model)
    params = {p.untyped_storage()._cdata for p in model.parameters()}
    saved: dict[int, int] = {}
    inside = [False]

    def pack(t: torch.Tensor) -> torch.Tensor:
        if inside[0] and isinstance(t, torch.Tensor):
            storage = t.untyped_storage()
            if storage._cdata not in params:
                saved[storage._cdata] = storage.nbytes()
        return t

    hooks = [
        block.register_forward_pre_hook(lambda *_: inside.__setitem__(0, True)),
        block.register_forward_hook(lambda *_: inside.__setitem__(0, False)),
    ]
    try:
        args, keywords = meta_inputs(cfg, grid, text, image, token_levels, dtype)
        with _FlashOnMeta(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(*args, **keywords)
    finally:
        for hook in hooks:
            hook.remove()
    return sum(saved.values())


def block_bytes_per_rank(
    cfg: Model,
    grid: Grid,
    samples: int,
    text: int,
    image: int,
    token_levels: bool,
    compute: int,
    tokens: float,
) -> float:
    """Bytes one block saves on a rank holding `tokens` video tokens of `samples` clips of token grid
    `grid` (fewer than the clips' under context parallel), each with `text` caption and `image` image
    tokens. What a block saves is linear in the tokens (attention keeps a log-sum-exp per token, not the
    S x S probabilities), so two runs of the module give it: the clip's, and one of twice its frames;
    their difference is the bytes per video token, the rest (caption, image, per-clip modulation) is per
    clip."""
    dtype = torch.bfloat16 if compute == 2 else torch.float32
    one = block_saved_bytes(cfg, grid, text, image, token_levels, dtype)
    two = block_saved_bytes(cfg, (2 * grid[0], grid[1], grid[2]), text, image, token_levels, dtype)
    per_token = (two - one) / (grid[0] * grid[1] * grid[2])
    return samples * (2 * one - two) + per_token * tokens
