"""The vidforge family's tensor-parallel plan (Megatron column/row split, and sequence parallel) for the
DiT and ST-DiT, declared with DTensor's `parallelize_module` over an unmodified model (torchtitan's
llama3 `parallelize` is the pattern); the styles and the sequence-parallel region it uses are shared
(`vidforge.parallel.tensor_parallel`). Order (torchtitan's): pipeline split, then `apply_tp`, then
activation checkpointing, compile, FSDP2.

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
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Partial, Placement, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.distributed.tensor.parallel.style import ParallelStyle

from vidforge.families.vidforge.blocks import DiTBlock
from vidforge.families.vidforge.dit import DiT
from vidforge.families.vidforge.stdit import ParallelSTDiTBlock, STDiTBlock
from vidforge.models.layers import CrossAttention, Modulation, SelfAttention
from vidforge.parallel.tensor_parallel import (
    SEQUENCE_DIM,
    GatheredColwiseParallel,
    ReplicatedParallel,
    apply_sequence_region,
    check_tp_model,
)

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
