"""Tensor parallel (Megatron column/row split) and sequence parallel for the DiT and ST-DiT, declared with
DTensor's `parallelize_module` over an unmodified model (torchtitan's llama3 `parallelize` is the pattern).

Inside every block, on the `tp` mesh dimension:
- attention q/k/v (self and cross) and MLP fc1/fc3 are column-parallel: a rank computes its heads and its
  slice of the MLP's inner width; attention runs on local heads (the layers read the head count from
  the projection width). QK RMSNorm normalises each head alone, so it stays local; its weight (shared
  by the heads) is a replicated DTensor whose gradient sums over the ranks' heads.
- attention `out` and MLP fc2 are row-parallel: partial sums, all-reduced (plain TP) or
  reduce-scattered along the sequence (sequence parallel).
- cross-attention k/v over the caption are column-parallel too, so each rank projects the text only
  for its own heads. The text enters each cross-attention once as a replicated DTensor, so the k and v
  projections share one all-reduce of its gradient.
- the adaptive-norm modulation Linear (N, hidden) -> (N, chunks*hidden) is column-parallel with its
  output all-gathered: per sample it is tiny to compute and to gather, but its weight is
  chunks*hidden^2, so sharding it saves memory, and its weight gradient needs no reduction (replicating
  it would all-reduce a chunks*hidden^2 gradient every step under sequence parallel). The same holds
  for AdaLN-LoRA's up projection, the model's shared modulation and the final layer's modulation. The
  rank-r down projection is replicated.

Sequence parallel (`parallel.sequence_parallel`): between sub-layers the residual stream of a block holds
S/tp tokens per rank (norms, modulate, gates and residual adds run on those), all-gathered along the
sequence where a sub-layer's column-parallel projections read it and reduce-scattered after its
row-parallel projection. The row is split evenly: S (the tokens of the plain batch's grid, or of the
packed row) must be a multiple of tp, else a UserInputError says what to change; nothing is padded. The
stream enters the sharded region at the first block (a slice, no communication; its gradient is
all-gathered) and leaves after the last block (all-gathered), so patch embedding, the absolute
position embedding and the final layer run unchanged on the whole row. Each block receives its rank's
slice of the per-token sample index (`Conditioning.token_slice`), so packed rows broadcast the right
samples' modulation to the local tokens; the modulation's gradient, summed over local tokens only, is
declared partial and reduced with the reduce-scatter of the column-parallel output.

Gradients of replicated parameters that only some of the computation touches (QK norms, LoRA down) are
DTensors in `Partial` placement after backward. FSDP2 reduces them when it reduce-scatters; without
FSDP, `clip_grad_norm_` below reduces them first. Parameters outside the blocks (patch, timestep and text
embeddings, null caption, final projection) stay plain tensors replicated on the tp ranks, with
gradients that are already complete on every rank.

Order (torchtitan's): pipeline split, then `apply_tp`, then activation checkpointing, compile, FSDP2.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import fields
from functools import partial

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import (
    DTensor,
    Partial,
    Placement,
    Replicate,
    Shard,
    distribute_module,
    distribute_tensor,
)
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.distributed.tensor.parallel.style import ParallelStyle

from vidforge.errors import UserInputError
from vidforge.families.vidforge.blocks import DiTBlock
from vidforge.families.vidforge.dit import DiT
from vidforge.families.vidforge.stdit import ParallelSTDiTBlock, STDiTBlock
from vidforge.models.layers import Conditioning, CrossAttention, Modulation, SelfAttention

SEQUENCE_DIM = 1  # tokens are (B, S, hidden)


# --- parallel styles this model needs beyond DTensor's -------------------------------------------------


class GatheredColwiseParallel(ParallelStyle):
    """A column-parallel Linear whose output is all-gathered, for small per-sample inputs with a wide
    output (the modulation). The input is replicated. `partial_grad`: the output's gradient on each rank
    covers only that rank's tokens (sequence parallel), so it is declared `Partial` and summed by the
    reduce-scatter back to the column shards; otherwise it is complete on every rank and each rank takes
    its columns."""

    def __init__(self, *, partial_grad: bool) -> None:
        super().__init__()
        self.partial_grad = partial_grad

    @staticmethod
    def _shard_columns(name: str, module: nn.Module, mesh: DeviceMesh) -> None:
        for pname, param in list(module.named_parameters(recurse=False)):
            sharded = distribute_tensor(param, mesh, [Shard(0)])
            module.register_parameter(pname, nn.Parameter(sharded, requires_grad=param.requires_grad))

    @staticmethod
    def _input(module: nn.Module, inputs: tuple, mesh: DeviceMesh) -> tuple:
        x = inputs[0]
        if not isinstance(x, DTensor):
            x = DTensor.from_local(x, mesh, (Replicate(),), run_check=False)
        return (x, *inputs[1:])

    @staticmethod
    def _output(partial_grad: bool, module: nn.Module, out: DTensor, mesh: DeviceMesh) -> torch.Tensor:
        gathered = out.redistribute(placements=(Replicate(),))
        return gathered.to_local(grad_placements=(Partial(),) if partial_grad else None)

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not isinstance(module, nn.Linear):
            raise TypeError(f"GatheredColwiseParallel applies to nn.Linear, got {type(module).__name__}")
        return distribute_module(
            module,
            device_mesh,
            self._shard_columns,
            self._input,
            partial(self._output, self.partial_grad),
        )


class ReplicatedParallel(ParallelStyle):
    """Parameters replicated as DTensors on the tp mesh (so FSDP2 and gradient reduction see one mesh per
    block); the module computes on replicated inputs and returns a plain tensor."""

    @staticmethod
    def _input(module: nn.Module, inputs: tuple, mesh: DeviceMesh) -> tuple:
        return tuple(
            DTensor.from_local(x, mesh, (Replicate(),), run_check=False)
            if isinstance(x, torch.Tensor) and not isinstance(x, DTensor)
            else x
            for x in inputs
        )

    @staticmethod
    def _output(module: nn.Module, out: DTensor, mesh: DeviceMesh) -> torch.Tensor:
        return out.redistribute(placements=(Replicate(),)).to_local()

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        return distribute_module(module, device_mesh, None, self._input, self._output)


# --- the plan ---------------------------------------------------------------------------------------------


def _modulation_plan(
    modulation: Modulation, prefix: str, sequence_parallel: bool
) -> dict[str, ParallelStyle]:
    if modulation.lora_rank:
        return {
            f"{prefix}.down": ReplicatedParallel(),
            f"{prefix}.up": GatheredColwiseParallel(partial_grad=sequence_parallel),
        }
    return {f"{prefix}.proj": GatheredColwiseParallel(partial_grad=sequence_parallel)}


def _projection_plan(
    attn: SelfAttention | CrossAttention, prefix: str, out_layout: Placement, local_out: bool
) -> dict[str, ParallelStyle]:
    """q/k/v column-wise, per-head norms local (heads are dim 2 of (B, S, heads, head_dim)), out row-wise."""
    plan: dict[str, ParallelStyle] = {f"{prefix}.{name}": ColwiseParallel() for name in ("q", "k", "v")}
    for name in ("q_norm", "k_norm"):
        if isinstance(getattr(attn, name), nn.RMSNorm):
            plan[f"{prefix}.{name}"] = SequenceParallel(sequence_dim=2, use_local_output=True)
    plan[f"{prefix}.out"] = RowwiseParallel(output_layouts=out_layout, use_local_output=local_out)
    return plan


def _self_attention_plan(attn: SelfAttention, prefix: str, stream: Placement) -> dict[str, ParallelStyle]:
    # The input enters once as a replicated DTensor (all-gathered under SP), so q, k and v share one
    # gather in the forward and one reduction of the input gradient in the backward.
    return {
        prefix: PrepareModuleInput(
            input_layouts=(stream, None, None),
            desired_input_layouts=(Replicate(), None, None),
            use_local_output=False,
        ),
        **_projection_plan(attn, prefix, stream, local_out=True),
    }


def _cross_attention_plan(attn: CrossAttention, prefix: str, stream: Placement) -> dict[str, ParallelStyle]:
    return {
        prefix: PrepareModuleInput(
            input_layouts=(stream, Replicate(), None),
            desired_input_layouts=(Replicate(), Replicate(), None),
            use_local_output=False,
        ),
        **_projection_plan(attn, prefix, stream, local_out=True),
    }


def _mlp_plan(block: nn.Module, stream: Placement) -> dict[str, ParallelStyle]:
    plan: dict[str, ParallelStyle] = {
        "mlp": PrepareModuleInput(
            input_layouts=(stream,), desired_input_layouts=(Replicate(),), use_local_output=False
        ),
        "mlp.fc1": ColwiseParallel(),
        "mlp.fc2": RowwiseParallel(output_layouts=stream),
    }
    if block.mlp.fc3 is not None:
        plan["mlp.fc3"] = ColwiseParallel()
    return plan


def block_plan(block: nn.Module, sequence_parallel: bool) -> dict[str, ParallelStyle]:
    """The `parallelize_module` plan of one DiT / ST-DiT block. `stream` is the placement of the residual
    stream between sub-layers: sharded along the sequence under SP, else replicated."""
    stream: Placement = Shard(SEQUENCE_DIM) if sequence_parallel else Replicate()
    plan = _modulation_plan(block.modulation, "modulation", sequence_parallel)
    if isinstance(block, DiTBlock):
        plan |= _self_attention_plan(block.self_attn, "self_attn", stream)
    elif isinstance(block, STDiTBlock):
        plan |= _self_attention_plan(block.spatial_attn, "spatial_attn", stream)
        plan |= _self_attention_plan(block.temporal_attn, "temporal_attn", stream)
    elif isinstance(block, ParallelSTDiTBlock):
        # The three branches read one input: gather it once (attn_input); their row-parallel outputs stay
        # partial sums, added, then reduced once (attn_sum).
        plan["attn_input"] = PrepareModuleOutput(
            output_layouts=stream, desired_output_layouts=Replicate(), use_local_output=False
        )
        for name in ("spatial_attn", "temporal_attn", "full_attn"):
            plan |= _projection_plan(getattr(block, name), name, Partial(), local_out=False)
        plan["attn_sum"] = PrepareModuleOutput(
            output_layouts=Partial(), desired_output_layouts=stream, use_local_output=True
        )
    else:
        raise TypeError(f"apply_tp: no tensor-parallel plan for block type {type(block).__name__}")
    plan |= _cross_attention_plan(block.cross_attn, "cross_attn", stream)
    return plan | _mlp_plan(block, stream)


# --- sequence-parallel region ---------------------------------------------------------------------------


def _scatter_sequence(h: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    """Whole row (replicated) -> this rank's slice; the backward all-gathers the gradient."""
    full = DTensor.from_local(h, mesh, (Replicate(),), run_check=False)
    return full.redistribute(placements=(Shard(SEQUENCE_DIM),)).to_local()


def _gather_sequence(h: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    """This rank's slice -> whole row; the backward keeps the slice of the (replicated) gradient."""
    part = DTensor.from_local(h, mesh, (Shard(SEQUENCE_DIM),), run_check=False)
    return part.redistribute(placements=(Replicate(),)).to_local()


class _RankTokensConditioning(Conditioning):
    """A block's conditioning under sequence parallel when the block adds learned per-sample rows of its
    own to the modulation before broadcasting it (Wan's `scale_shift_table`): those rows meet only this
    rank's tokens, so their gradient, and the modulation's, is this rank's part. `per_token` sums it over
    the tp ranks (identity forward, all-reduce of the (N, F) rows' gradient backward), which makes the
    table's and the time projection's gradients complete on every rank."""

    def __init__(self, cond: Conditioning, mesh: DeviceMesh) -> None:
        super().__init__(**{f.name: getattr(cond, f.name) for f in fields(cond)})
        self.mesh = mesh

    def per_token(self, values: torch.Tensor) -> torch.Tensor:
        rows = DTensor.from_local(values, self.mesh, (Replicate(),), run_check=False)
        return super().per_token(rows.to_local(grad_placements=(Partial(),)))


def _sequence_parallel_inputs(
    mesh: DeviceMesh, first: bool, sum_rows: bool, module: nn.Module, args: tuple, kwargs: dict
):
    """Forward pre-hook of every block under SP: the first block slices the row; every block gets the
    conditioning of its rank's tokens."""
    if len(args) < 2 or not isinstance(args[1], Conditioning):
        raise TypeError("sequence parallel expects blocks called as block(hidden_states, conditioning)")
    h, cond = args[0], args[1]
    tp = mesh.size()
    if first:
        if h.shape[SEQUENCE_DIM] % tp:
            raise UserInputError(
                f"parallel.sequence_parallel: the token row has {h.shape[SEQUENCE_DIM]} tokens, not a "
                f"multiple of parallel.tp={tp}; choose latent sizes (or a packing budget) whose token "
                "count divides by tp, or set parallel.sequence_parallel=false"
            )
        h = _scatter_sequence(h, mesh)
    local = h.shape[SEQUENCE_DIM]
    start = mesh.get_local_rank() * local
    cond = cond.token_slice(start, start + local)
    if sum_rows:
        cond = _RankTokensConditioning(cond, mesh)
    return (h, cond, *args[2:]), kwargs


def _gather_output(mesh: DeviceMesh, module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
    return _gather_sequence(output, mesh)


def apply_sequence_region(blocks: list[nn.Module], mesh: DeviceMesh, *, sum_per_sample_grads: bool) -> None:
    """Make `blocks` (a model's or a pipeline stage's, in order) the sequence-parallel region: the first
    slices the row (its tokens must divide by tp), each block sees its rank's tokens and conditioning, the
    last all-gathers its output. `sum_per_sample_grads`: reduce the gradient of what blocks broadcast with
    `Conditioning.per_token` over the tp ranks (`_RankTokensConditioning`); the DiT's modulation Linear
    does this in its own reduce-scatter (`GatheredColwiseParallel(partial_grad=True)`) instead."""
    for i, block in enumerate(blocks):
        block.register_forward_pre_hook(
            partial(_sequence_parallel_inputs, mesh, i == 0, sum_per_sample_grads), with_kwargs=True
        )
    if blocks:
        blocks[-1].register_forward_hook(partial(_gather_output, mesh))


def check_tp_model(model: nn.Module, tp: int) -> None:
    """Refuse a model (either family) whose heads or MLP width tp does not divide, or whose Linears are
    float8 ones, before any of it is sharded."""
    cfg = model.config
    for field, value in (("heads", cfg.heads), ("mlp_hidden", cfg.mlp_hidden)):
        if value % tp:
            raise UserInputError(
                f"parallel.tp={tp} must divide model.{field}={value}; change parallel.tp or the model shape"
            )
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and type(module) is not nn.Linear:
            # torchao's Float8Linear needs its own float8 TP styles (Float8ColwiseParallel, ...).
            raise UserInputError(
                f"parallel.tp={tp}: {name} is a {type(module).__name__}; tensor parallel of float8 linear "
                "layers is not supported yet; set train.fp8=false or parallel.tp=1"
            )


# --- entry points ---------------------------------------------------------------------------------------


def apply_tp(model: DiT, tp_mesh: DeviceMesh, *, sequence_parallel: bool) -> None:
    """Tensor (and, with `sequence_parallel`, sequence) parallel over the 1-D `tp_mesh`, in place. Call on
    the model (or a pipeline stage of it) before activation checkpointing, compile and FSDP. Weights are
    taken from tp rank 0 (`distribute_tensor`), so a model initialised before this call keeps its values."""
    if tp_mesh.ndim != 1:
        raise ValueError(f"apply_tp takes the 1-D tp mesh (e.g. mesh['tp']), got {tp_mesh.ndim} dimensions")
    tp = tp_mesh.size()
    check_tp_model(model, tp)
    for block in model.blocks.values():
        parallelize_module(block, tp_mesh, block_plan(block, sequence_parallel))
    if model.shared_modulation is not None:
        parallelize_module(
            model.shared_modulation, tp_mesh, GatheredColwiseParallel(partial_grad=sequence_parallel)
        )
    if model.final is not None:
        # The final layer runs on the whole row on every rank: its modulation gradient is complete.
        parallelize_module(model.final.modulation, tp_mesh, GatheredColwiseParallel(partial_grad=False))
    if sequence_parallel:
        apply_sequence_region(list(model.blocks.values()), tp_mesh, sum_per_sample_grads=False)


@torch.no_grad()
def reduce_partial_grads(parameters: Iterable[nn.Parameter]) -> int:
    """Turn gradients left as `Partial` DTensors (replicated parameters used on a rank's heads or tokens
    only) into their parameters' placements, once, before anything reads them. FSDP2 does this itself
    when it reduce-scatters, so this finds nothing to do there. Returns how many it reduced."""
    count = 0
    for p in parameters:
        g = p.grad
        if isinstance(g, DTensor) and isinstance(p, DTensor) and g.placements != p.placements:
            p.grad = g.redistribute(placements=p.placements)
            count += 1
    return count


def _by_mesh(grads: Iterable[torch.Tensor]) -> dict[object, list[torch.Tensor]]:
    """Gradients by mesh and device (FSDP2's CPU offload leaves some shards' gradients in host memory)."""
    groups: dict[object, list[torch.Tensor]] = {}
    for g in grads:
        groups.setdefault((g.device_mesh if isinstance(g, DTensor) else None, g.device), []).append(g)
    return groups


@torch.no_grad()
def grad_norm(grads: Iterable[torch.Tensor]) -> torch.Tensor:
    """The global L2 norm (float64, a plain tensor) of gradients that may live on different meshes:
    tensor-parallel blocks on (dp_shard, tp), replicated embeddings on dp_shard only, plain tensors.
    `torch.nn.utils.get_total_norm` cannot stack norms from different meshes; this takes one norm per
    mesh (`full_tensor` of a DTensor norm counts each shard once) and combines them. Reduce partial
    gradients first (`reduce_partial_grads`). A pipeline stage adds the squares over the pp group."""
    squares = []
    for group in _by_mesh(grads).values():
        norm = torch.nn.utils.get_total_norm(group, 2.0)
        if isinstance(norm, DTensor):
            mesh = norm.device_mesh
            if norm.device.type != mesh.device_type:  # host-memory shards: NCCL reduces device tensors only
                norm = DTensor.from_local(norm.to_local().to(mesh.device_type), mesh, norm.placements)
            norm = norm.full_tensor()
        squares.append(norm.to(torch.float64) ** 2)
    return torch.stack(squares).sum().sqrt() if squares else torch.tensor(0.0, dtype=torch.float64)


@torch.no_grad()
def clip_grad_norm_(parameters: Iterable[nn.Parameter], max_norm: float) -> torch.Tensor:
    """`torch.nn.utils.clip_grad_norm_` (L2) for models whose parameters live on different meshes (see
    `grad_norm`): reduces partial gradients, takes the global norm, and scales every gradient by
    max_norm / (norm + 1e-6), torch's formula, where that is below 1 (an infinite max_norm only
    measures). Returns the norm as a float64 plain tensor."""
    params = [p for p in parameters if p.grad is not None]
    reduce_partial_grads(params)
    total = grad_norm(p.grad for p in params)
    coef = max_norm / (float(total) + 1e-6)  # one host read; the caller logs the norm anyway
    if coef < 1.0:
        for group in _by_mesh(p.grad for p in params).values():
            torch._foreach_mul_(group, coef)
    return total
