"""Exact parameter counts of a model section, by the parts the memory and communication models treat
differently: what every block holds, what tensor parallel splits, and what sits outside the blocks."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn

from vidforge.memory import device_memory_bytes, require
from vidforge.profile.model import Model
from vidforge.profile.train import Lora


@dataclass(frozen=True)
class TensorParallelRules:
    """Which parameters tensor parallel splits, by name: every block parameter but those named in
    `replicated_in_block` and the biases of the `row_wise` layers; outside the blocks only those under
    `split_outside`."""

    replicated_in_block: tuple[str, ...]
    row_wise: tuple[str, ...]
    split_outside: tuple[str, ...]
    gathered_output: tuple[str, ...] = ()
    """Column-parallel block layers whose output the plan all-gathers again (per-sample modulation,
    `GatheredColwiseParallel`): their weights split, their activations whole."""


def tp_rules(family_name: str) -> TensorParallelRules:
    """What the family's tensor-parallel plan splits (`FamilySpec.tp_rules`)."""
    from vidforge.families import family

    return TensorParallelRules(*family(family_name).tp_rules)


def _tp_split(name: str, rules: TensorParallelRules) -> bool:
    """Whether tensor parallel splits the block parameter called `name` (relative to the block)."""
    if any(part in name for part in rules.replicated_in_block):
        return False
    module, _, kind = name.rpartition(".")
    row_wise = any(module == r or module.endswith("." + r) for r in rules.row_wise)
    return not (kind == "bias" and row_wise)


@dataclass(frozen=True)
class ParameterCounts:
    total: int
    block: int
    """Parameters of one transformer block (all blocks are alike)."""
    block_tp: int
    """Of those, the ones tensor parallel splits."""
    outside: int
    """Patch and caption embeddings, timestep MLP, shared modulation, null caption, final layer."""
    outside_tp: int
    """Of those, the ones tensor parallel splits (the shared and the final layer's modulation)."""
    linear_weights: int
    """Weights of every nn.Linear: what bf16 autocast casts and keeps for the backward."""
    layers: int
    block_linear_weights: int = 0
    """Weights of one block's nn.Linear layers (what `train.lora.fp8_base` stores in float8)."""
    block_linear_rows: int = 0
    """Output rows of one block's nn.Linear layers (one float32 scale each under per-row fp8)."""
    block_linears: int = 0
    """nn.Linear layers in one block."""
    block_largest_linear: int = 0
    """Weights of one block's largest nn.Linear (the fp8 base dequantizes one layer at a time)."""


@functools.lru_cache(maxsize=64)
def parameter_counts(cfg: Model) -> ParameterCounts:
    """Counted on a model built on the meta device: no memory, exact for every preset."""
    from vidforge.models import build_model

    model = build_model(cfg, device="meta")
    block = next(iter(model.blocks.values()))
    block_total = sum(p.numel() for p in block.parameters())
    rules = tp_rules(cfg.family)
    block_tp = sum(p.numel() for name, p in block.named_parameters() if _tp_split(name, rules))
    outside_tp = sum(
        p.numel()
        for name, p in model.named_parameters()
        if not name.startswith("blocks.") and name.startswith(rules.split_outside)
    )
    total = sum(p.numel() for p in model.parameters())
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    block_linears = [m for m in block.modules() if isinstance(m, nn.Linear)]
    return ParameterCounts(
        total=total,
        block=block_total,
        block_tp=block_tp,
        outside=total - cfg.layers * block_total,
        outside_tp=outside_tp,
        linear_weights=linear,
        layers=cfg.layers,
        block_linear_weights=sum(m.weight.numel() for m in block_linears),
        block_linear_rows=sum(m.out_features for m in block_linears),
        block_linears=len(block_linears),
        block_largest_linear=max((m.weight.numel() for m in block_linears), default=0),
    )


def tp_local_parameters(counts: ParameterCounts, blocks: int, tp: int) -> float:
    """Parameters one tensor-parallel rank holds of a stage of `blocks` blocks (with every part outside
    the blocks, an upper bound for pipeline stages)."""
    outside = counts.outside - counts.outside_tp + counts.outside_tp / tp
    return outside + blocks * (counts.block - counts.block_tp + counts.block_tp / tp)


def lora_parameters(cfg: Model, lora: Lora) -> tuple[int, int]:
    """(adapter parameters of one block, of the rest of the model) that `train.lora` adds: counted on a
    meta-device model given its adapters by peft, as training does (once per rank and targets)."""
    first, outside, _ = _lora_parameters(cfg, lora.rank, lora.target_modules)
    return first, outside


def lora_adapted(cfg: Model, lora: Lora) -> frozenset[str]:
    """The layers of a block that `train.lora`'s targets give adapters, by their path in the block
    (`attn1.to_q`, `ffn.net.0.proj`, `mlp.fc1`)."""
    return _lora_parameters(cfg, lora.rank, lora.target_modules)[2]


@functools.lru_cache(maxsize=64)
def _lora_parameters(
    cfg: Model, rank: int, targets: tuple[str, ...] | None
) -> tuple[int, int, frozenset[str]]:
    lora = Lora(rank=rank, target_modules=targets)
    from vidforge.lora import apply_lora, is_adapter
    from vidforge.models import build_model

    model = build_model(cfg, device="meta")
    apply_lora(model, lora, torch.float32)
    adapters = {name: p.numel() for name, p in model.named_parameters() if is_adapter(name)}
    first = sum(n for name, n in adapters.items() if name.startswith("blocks.0."))
    blocks = sum(n for name, n in adapters.items() if name.startswith("blocks."))
    adapted = frozenset(
        name.removeprefix("blocks.0.").split(".lora_")[0] for name in adapters if name.startswith("blocks.0.")
    )
    return first, sum(adapters.values()) - blocks, adapted


def require_model(
    model_cfg: object, bytes_per_parameter: float, ranks: int, device: object, fix: str, resident: int = 1
) -> None:
    """Refuse a model whose parameters alone, at `bytes_per_parameter` each and split over `ranks`, exceed
    `device`'s memory (`model.hidden=1000000` asked the allocator for 4 TB after a minute). Counted on a
    model built on the meta device (`parameter_counts`): no memory. `resident`: networks of this shape
    held at once (a two-expert model's sampling holds both; its training one)."""
    total = parameter_counts(model_cfg).total * resident
    require(
        total * bytes_per_parameter / ranks,
        device_memory_bytes(device),
        f"the model ({total:,} parameters at {bytes_per_parameter:g} bytes"
        + (f" over {ranks} ranks)" if ranks > 1 else ")"),
        fix,
    )


@functools.lru_cache(maxsize=64)
def block_linears(cfg: Model) -> tuple[tuple[str, int], ...]:
    """(path in the block, output features) of each linear layer of one block, in order: counted on a
    model built on the meta device."""
    from torch import nn

    from vidforge.models import build_model

    model = build_model(cfg.model_copy(update={"layers": 1}), device="meta")  # blocks share one shape
    block = next(iter(model.blocks.values()))
    return tuple((name, m.out_features) for name, m in block.named_modules() if isinstance(m, nn.Linear))
