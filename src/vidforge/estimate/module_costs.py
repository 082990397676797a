"""The bytes a block saves for its backward, read off the family's network: a one-block copy runs on the
meta device (no memory allocated, nothing computed: a 14B block at 75K tokens in a fraction of a
second) under `saved_tensors_hooks`, counting each storage the block creates once (views and tensors
several ops save count once), and its input; not parameters, nor what every block shares (the
caption's embedding, the RoPE tables, the timestep's conditioning). Attention runs as FlashAttention
(`aten._scaled_dot_product_flash_attention`, whose meta kernel gives the tensors the GPU's keeps: q, k,
v, the output and a float32 log-sum-exp per head and token), not the math fallback a meta tensor would
otherwise take (which keeps the S x S probabilities). The FLOPs are read the same way (`models.flops`).

Every block of a family is the same module, so one block stands for all. Cached per (model section,
token grid, caption and image tokens, noise level per token, dtype, LoRA, first block or not)."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from vidforge.models.flops import first_block, meta_inputs, meta_key, meta_network, one_block
from vidforge.models.presets import build_model
from vidforge.profile.model import Model
from vidforge.tokens import Grid


class _FlashOnMeta(TorchFunctionMode):
    """SDPA as FlashAttention's kernel, whose meta implementation gives the tensors the GPU's saves."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # a key-padding mask changes no saved shape: flash's varlen kernel keeps the same tensors
        if func is F.scaled_dot_product_attention and args[0].device.type == "meta":
            q, k, v = args[:3]
            scale = kwargs.get("scale")
            return torch.ops.aten._scaled_dot_product_flash_attention(
                q, k, v, 0.0, bool(kwargs.get("is_causal", False)), False, scale=scale
            )[0]
        return func(*args, **kwargs)


def block_saved_bytes(
    cfg: Model,
    grid: Grid,
    text: int,
    image: int,
    token_levels: bool,
    dtype: torch.dtype,
    lora: tuple[int, tuple[str, ...] | None] | None = None,
    first: bool = False,
) -> int:
    """Bytes one block saves for its backward on one sample, read with saved-tensor hooks on the meta
    device: the storages the block's own ops create and its input (the previous block's output), each
    once, not what every block shares (the caption's embedding, the RoPE tables, the timestep's
    conditioning: counted once, outside the blocks) nor a parameter. Attention runs as FlashAttention.
    `lora`: (rank, target modules) of a LoRA on a frozen base in `dtype` (the adapters cast to it, as
    autocast casts them). The block is one in the middle of the stack, whose input needs a gradient
    (an earlier block trains); `first`: the first block, whose input (the patch embedding's output,
    frozen under LoRA) may not."""
    key = meta_key(cfg, attention="sdpa", sdpa_backend="auto")
    with torch.inference_mode(False), torch.enable_grad():  # whatever the caller's mode (see sample_flops)
        return _block_saved_bytes(key, tuple(grid), text, image, token_levels, dtype, lora, first)


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


class _Created(TorchDispatchMode):
    """The storages of what the ops produce while `inside[0]` is set."""

    def __init__(self, inside: list[bool]) -> None:
        super().__init__()
        self.inside, self.storages = inside, set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.inside[0]:  # new storages only: a view's (a weight's transpose) is its input's
            given = {_storage(t) for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
            for t in pytree.tree_leaves(out):
                if isinstance(t, torch.Tensor) and _storage(t) not in given:
                    self.storages.add(_storage(t))
        return out


@functools.lru_cache(maxsize=4096)
def _block_saved_bytes(
    key: str,
    grid: Grid,
    text: int,
    image: int,
    token_levels: bool,
    dtype: torch.dtype,
    lora: tuple[int, tuple[str, ...] | None] | None,
    first: bool,
) -> int:
    cfg = one_block(key)
    model = meta_network(key, dtype) if lora is None else _lora_network(key, dtype, lora)
    _, block = first_block(model)
    saved: dict[int, int] = {}
    inside = [False]
    created = _Created(inside)

    def pack(t: torch.Tensor) -> torch.Tensor:
        if inside[0] and isinstance(t, torch.Tensor):
            storage = t.untyped_storage()
            if storage._cdata in created.storages:
                saved[storage._cdata] = storage.nbytes()
        return t

    def enter(_module, args):
        inside[0] = True
        x = args[0]
        if not first:  # a block further down the stack: its input comes from a block that trains
            x = x.detach().requires_grad_()
        created.storages.add(x.untyped_storage()._cdata)
        return (x, *args[1:])

    hooks = [
        block.register_forward_pre_hook(enter),
        block.register_forward_hook(lambda *_: inside.__setitem__(0, False)),
    ]
    try:
        args, keywords = meta_inputs(cfg, grid, text, image, token_levels, dtype)
        hooks_on = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
        with _FlashOnMeta(), created, hooks_on:
            model(*args, **keywords)
    finally:
        for hook in hooks:
            hook.remove()
    return sum(saved.values())


@functools.lru_cache(maxsize=8)
def _lora_network(key: str, dtype: torch.dtype, lora: tuple[int, tuple[str, ...] | None]) -> torch.nn.Module:
    from vidforge.lora import apply_lora
    from vidforge.profile.train import Lora

    model = build_model(one_block(key), device="meta")
    apply_lora(model, Lora(rank=lora[0], target_modules=lora[1]), dtype)
    return model.to(dtype)


def block_bytes_per_rank(
    cfg: Model,
    grid: Grid,
    samples: int,
    text: int,
    image: int,
    token_levels: bool,
    compute: int,
    tokens: float,
    lora: tuple[int, tuple[str, ...] | None] | None = None,
    first: bool = False,
) -> float:
    """Bytes one block saves on a rank holding `tokens` video tokens of `samples` clips of token grid
    `grid` (fewer than the clips' under context parallel), each with `text` caption and `image` image
    tokens (`lora`, `first`: as `block_saved_bytes`). What a block saves is linear in the tokens
    (attention keeps a log-sum-exp per token, not the S x S probabilities), so two runs of the module
    give it: the clip's, and one of twice its frames; their difference is the bytes per video token, the
    rest (caption, image, per-clip modulation) is per clip."""
    dtype = torch.bfloat16 if compute == 2 else torch.float32
    one = block_saved_bytes(cfg, grid, text, image, token_levels, dtype, lora, first)
    double = (2 * grid[0], grid[1], grid[2])
    two = block_saved_bytes(cfg, double, text, image, token_levels, dtype, lora, first)
    per_token = (two - one) / (grid[0] * grid[1] * grid[2])
    return samples * (2 * one - two) + per_token * tokens
