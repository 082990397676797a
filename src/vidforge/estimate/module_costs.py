"""The bytes a training step saves for its backward, read off the family's network: a one-block copy runs
on the meta device (no memory allocated, nothing computed: a 14B block at 75K tokens in a fraction of a
second) under `saved_tensors_hooks`, counting each storage once (views and tensors several ops save count
once), parameters never. What the block's own ops create, and its input (the previous block's output),
is the block's; every other saved storage (the model's inputs, the embedders', the output layer's, and
what every block reads but none makes: the caption's embedding, the RoPE tables, the timestep's
conditioning) is outside the blocks, held once. Attention runs as FlashAttention
(`aten._scaled_dot_product_flash_attention`, whose meta kernel gives the tensors the GPU's keeps: q, k,
v, the output and a float32 log-sum-exp per head and token), not the math fallback a meta tensor would
otherwise take (which keeps the S x S probabilities). The FLOPs are read the same way (`models.flops`).

Tensor parallel: the block is shrunk to one rank's shard as the family's plan splits it (`FamilySpec.
tp_rules`: column-parallel layers keep out_features / tp, row-parallel ones in_features / tp, a norm over
the split width its share, attention reads its local heads from the projection width as under the real
plan), and the storages are told apart by where they live: made between a column-parallel layer and the
row-parallel one that closes its region (a rank's widths, whole rows), read by a column-parallel layer
(sequence parallel all-gathers it there: whole rows), or the rest (the residual stream, norms,
modulation, gates: a rank's 1/tp of the tokens under sequence parallel, whole without it).

Every block of a family is the same module, so one block stands for all. Cached per (model section,
token grids of the row, packed or not, caption and image tokens, noise level per token, dtype, LoRA,
first block or not, tp)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from vidforge.estimate.param_counts import TensorParallelRules, tp_rules
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


@dataclass(frozen=True)
class Saved:
    """Bytes one forward saves for the backward, by where they live (see the module docstring)."""

    sharded: float
    """Made inside the block's tensor-parallel regions (a rank's widths, whole rows)."""
    gathered: float
    """Made by the block and read by a column-parallel layer (whole rows under sequence parallel)."""
    stream: float
    """The rest of the block's: residual stream, norms, modulation, gates, the block's input."""
    outside: float
    """Not made by the block, saved outside it: the model's inputs, the embedders', the output layer's."""
    shared: float = 0.0
    """Not made by the block, saved only by it: what every block reads (the caption's embedding, the RoPE
    tables, the timestep's conditioning), held once."""

    def block(self, split: int = 1) -> float:
        """A block's bytes, the stream's divided by `split` (tp under sequence parallel, else 1)."""
        return self.sharded + self.gathered + self.stream / split


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def _storages(tree: object) -> set[int]:
    return {_storage(t) for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)}


class _Created(TorchDispatchMode):
    """The storages the ops produce while `inside[0]` is set, and of those the ones in a tensor-parallel
    region (produced from a region's tensor). Every tensor produced is held until the run ends, so no
    storage's id is reused by a later one."""

    def __init__(self, inside: list[bool]) -> None:
        super().__init__()
        self.inside, self.storages, self.region, self.held = inside, set(), set(), []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.held.append(out)
        if self.inside[0]:  # new storages only: a view's (a weight's transpose) is its input's
            given = _storages((args, kwargs))
            made = _storages(out) - given
            self.storages |= made
            if given & self.region:
                self.region |= made
        return out


def saved_bytes(
    cfg: Model,
    grids: tuple[Grid, ...],
    packed: bool,
    text: int,
    image: int,
    token_levels: bool,
    dtype: torch.dtype,
    lora: tuple[int, tuple[str, ...] | None] | None = None,
    first: bool = False,
    tp: int = 1,
) -> Saved:
    """What one forward of the model `cfg` on one row saves for the backward, read with saved-tensor hooks
    on the meta device: the row holds the clips of token grids `grids` (one clip; or with `packed`,
    several packed into one sequence), each with `text` caption and `image` image tokens. `lora`: (rank,
    target modules) of a LoRA on a frozen base in `dtype` (the adapters cast to it, as autocast casts
    them). The block is one in the middle of the stack, whose input needs a gradient (an earlier block
    trains); `first`: the first block, whose input (the patch embedding's output, frozen under LoRA) may
    not. `tp`: one tensor-parallel rank's shard of the block."""
    key = meta_key(cfg, attention="sdpa", sdpa_backend="auto")
    grids = tuple(tuple(g) for g in grids)
    with torch.inference_mode(False), torch.enable_grad():  # whatever the caller's mode (see sample_flops)
        return _saved_bytes(key, grids, packed, text, image, token_levels, dtype, lora, first, tp)


@functools.lru_cache(maxsize=4096)
def _saved_bytes(
    key: str,
    grids: tuple[Grid, ...],
    packed: bool,
    text: int,
    image: int,
    token_levels: bool,
    dtype: torch.dtype,
    lora: tuple[int, tuple[str, ...] | None] | None,
    first: bool,
    tp: int,
) -> Saved:
    cfg = one_block(key)
    if tp > 1:
        model = build_model(cfg, device="meta").to(dtype)
    else:
        model = meta_network(key, dtype) if lora is None else _lora_network(key, dtype, lora)
    _, block = first_block(model)
    saved: dict[int, int] = {}
    saved_outside: set[int] = set()
    inside = [False]
    created = _Created(inside)
    gathered: set[int] = set()
    hooks = _shard(block, cfg, tp, created.region, gathered) if tp > 1 else []

    def pack(t: torch.Tensor) -> torch.Tensor:
        if isinstance(t, torch.Tensor) and not isinstance(t, nn.Parameter):
            saved[_storage(t)] = t.untyped_storage().nbytes()
            if not inside[0]:
                saved_outside.add(_storage(t))
        return t

    def enter(_module, args):
        inside[0] = True
        x = args[0]
        if not first:  # a block further down the stack: its input comes from a block that trains
            x = x.detach().requires_grad_()
        created.storages.add(_storage(x))
        return (x, *args[1:])

    def leave(_module, _args, out):
        inside[0] = False
        # the block's output is the next block's input, counted there (the last one's by the output layer)
        created.storages.difference_update(_storages(out))

    hooks += [block.register_forward_pre_hook(enter), block.register_forward_hook(leave)]
    try:
        args, keywords = meta_inputs(cfg, grids, packed, text, image, token_levels, dtype)
        hooks_on = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
        with _FlashOnMeta(), created, hooks_on:
            model(*args, **keywords)
    finally:
        for hook in hooks:
            hook.remove()
    params = {_storage(p) for p in model.parameters()}
    part = {"sharded": 0, "gathered": 0, "stream": 0, "outside": 0, "shared": 0}
    for storage, size in saved.items():
        if storage in params:
            continue
        if storage not in created.storages:
            part["outside" if storage in saved_outside else "shared"] += size
        elif storage in created.region:
            part["sharded"] += size
        else:
            part["gathered" if storage in gathered else "stream"] += size
    return Saved(**part)


def _shard(block: nn.Module, cfg: Model, tp: int, region: set[int], gathered: set[int]) -> list:
    """Shrink the meta `block` to one of `tp` ranks' shards as its family's plan splits it, and hook its
    split layers: a column-parallel layer's input is `gathered`, its output opens a `region` that the
    row-parallel layer's output closes."""
    rules: TensorParallelRules = tp_rules(cfg.family)
    hooks = []
    names = dict(block.named_modules())
    for name, layer in names.items():
        if not isinstance(layer, nn.Linear) or any(r in f"{name}." for r in rules.replicated_in_block):
            continue
        if name.endswith(rules.row_wise):
            _resize(layer, "weight", 1, tp)
            layer.in_features //= tp
            hooks.append(
                layer.register_forward_hook(lambda _m, _a, out: region.difference_update(_storages(out)))
            )
        elif not name.endswith(rules.gathered_output):  # a gathered output keeps its width
            width = layer.out_features
            _resize(layer, "weight", 0, tp)
            _resize(layer, "bias", 0, tp)
            layer.out_features //= tp
            hooks.append(layer.register_forward_pre_hook(lambda _m, args: gathered.update(_storages(args))))
            hooks.append(layer.register_forward_hook(lambda _m, _a, out: region.update(_storages(out))))
            parent = names[name.rpartition(".")[0]]
            for norm in parent.children():  # a norm over the split width (Wan's q/k across the heads)
                if isinstance(norm, nn.RMSNorm | nn.LayerNorm) and norm.normalized_shape == (width,):
                    _resize(norm, "weight", 0, tp)
                    _resize(norm, "bias", 0, tp)
                    norm.normalized_shape = (width // tp,)
    return hooks


def _resize(module: nn.Module, name: str, dim: int, tp: int) -> None:
    old = getattr(module, name, None)
    if old is None or old.shape[dim] % tp:
        return
    shape = list(old.shape)
    shape[dim] //= tp
    setattr(module, name, nn.Parameter(torch.empty(shape, device="meta", dtype=old.dtype)))


@functools.lru_cache(maxsize=8)
def _lora_network(key: str, dtype: torch.dtype, lora: tuple[int, tuple[str, ...] | None]) -> torch.nn.Module:
    from vidforge.lora import apply_lora
    from vidforge.profile.train import Lora

    model = build_model(one_block(key), device="meta")
    apply_lora(model, Lora(rank=lora[0], target_modules=lora[1]), dtype)
    return model.to(dtype)


@dataclass(frozen=True)
class RankSaved:
    """Bytes a rank's micro-batch saves for the backward: one block's, outside the blocks, and what every
    block reads and none makes (`Saved.shared`)."""

    block: float
    outside: float
    shared: float


def saved_per_rank(
    cfg: Model,
    grid: Grid,
    samples: int,
    packed: bool,
    text: int,
    image: int,
    token_levels: bool,
    compute: int,
    tokens: float,
    lora: tuple[int, tuple[str, ...] | None] | None = None,
    first: bool = False,
    tp: int = 1,
    sequence_parallel: bool = True,
) -> RankSaved:
    """Bytes saved on a rank holding `tokens` video tokens of `samples` clips of token grid `grid` (fewer
    than the clips' under context parallel), a plain batch or (`packed`) one row of them, each with
    `text` caption and `image` image tokens (`lora`, `first`, `tp`: as `saved_bytes`). What is saved is
    linear in the tokens (attention keeps a log-sum-exp per token, not the S x S probabilities), so two
    runs of the module give it: the row's, and one of twice its frames; their difference is the bytes per
    video token, the rest (caption, image, per-clip modulation) is per row. Under sequence parallel a
    rank holds 1/tp of the stream's tokens; outside the blocks is replicated on the tp ranks."""
    dtype = torch.bfloat16 if compute == 2 else torch.float32
    row = samples if packed else 1  # clips in one row; a plain batch is `samples` rows of one
    rows = samples // row
    grids = (tuple(grid),) * row
    double = ((2 * grid[0], grid[1], grid[2]),) * row
    row_tokens = row * grid[0] * grid[1] * grid[2]

    def per_rank(one: float, two: float, split: int = 1) -> float:
        per_token = (two - one) / row_tokens
        return rows * (one - per_token * row_tokens) + per_token * tokens / split

    args = (packed and row > 1, text, image, token_levels, dtype, lora, first)
    one, two = saved_bytes(cfg, grids, *args, tp=tp), saved_bytes(cfg, double, *args, tp=tp)
    split = tp if sequence_parallel else 1
    block = sum(
        per_rank(getattr(one, part), getattr(two, part), split if part == "stream" else 1)
        for part in ("sharded", "gathered", "stream")
    )
    if tp > 1:  # outside the blocks: the unsplit model's
        one, two = saved_bytes(cfg, grids, *args), saved_bytes(cfg, double, *args)
    return RankSaved(block, per_rank(one.outside, two.outside), per_rank(one.shared, two.shared))
