"""Tensor and sequence parallel for the ltx2 family (LTX-2's video transformer,
`vidforge.families.ltx2.network`), on the `tp` mesh: the Megatron split of every block, as Wan's
(`vidforge.families.wan.tensor_parallel`).

Inside every block: both attentions' to_q/to_k/to_v (and LTX-2.3's per-head gate logits, `gated_attention`)
and the feed-forward's first projection are column-parallel (a rank computes its heads and its slice of
the inner width; attention reads the head count from the projection width); `to_out.0` and `ff.net.2` are
row-parallel (partial sums, all-reduced). An attention's query input and its context each enter once as a
replicated DTensor (the same one in self-attention, where they are one tensor), so the projections that
read them share one all-reduce of its gradient.

Two things span the heads before they split:
- q/k RMSNorm normalises across the whole width (`nn.RMSNorm(hidden)`): `HeadsSpanningRMSNorm`
  (`vidforge.parallel.tensor_parallel`) all-reduces each row's sum of squares and scales a rank's features
  by its shard of the weight.
- RoPE rotates q and k over the whole width, with one angle table for it (not per head): each rank takes
  the tables of its own columns (`network.rope_columns`, told the rank through `Attention.tp_rank`):
  "interleaved" pairs neighbouring features, so a rank's contiguous columns (an even count: whole heads)
  hold whole pairs; "split" pairs the two halves of each head, with a table per head, so a rank takes its
  heads' rows. Either way each rank rotates exactly its features by the angles one process uses.

Everything else (the weightless norms on the residual stream, the per-block modulation tables, the time
and caption embedders, the output layer) stays replicated on the tp ranks, with gradients that are
complete on every rank because they act on replicated data (without sequence parallel; with it, below).

Sequence parallel (`parallel.sequence_parallel`), as Wan's: between sub-layers the residual stream holds
S/tp tokens per rank (`apply_sequence_region` slices the row at the first block and gathers it after the
last; S must divide by tp). Each attention's query input is all-gathered once where the attention starts
(the caption, its cross-attention's context, is whole on every rank), the feed-forward's first
projection gathers its input, and the row-parallel outputs are reduce-scattered back to the rank's
tokens. Attention, RoPE and the heads-spanning norms see whole rows, exactly as without SP. The block's
weightless norms hold no parameters; its `scale_shift_table` joins the time projection's rows before
they meet the tokens, and those rows' gradient is summed over the ranks where they do
(`sum_per_sample_grads`), which makes the table's, the time embedder's and LTX-2.3's query modulation's
gradients complete. The caption's prompt modulation acts on the whole caption: complete already.
"""

from __future__ import annotations

from functools import partial

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.distributed.tensor.parallel.style import ParallelStyle

from vidforge.families.ltx2.network import Attention, LTX2Transformer
from vidforge.parallel.tensor_parallel import (
    SEQUENCE_DIM,
    HeadsSpanningRMSNorm,
    apply_sequence_region,
    check_tp_model,
)


def _replicated_inputs(mesh: DeviceMesh, stream: Placement, module: nn.Module, args: tuple) -> tuple:
    """Forward pre-hook of an attention called as attn(x, context, mask, rope): x (the residual stream's,
    `stream`: gathered under SP) and context as replicated DTensors, one object when x is the context."""
    x, context, *rest = args
    query = DTensor.from_local(x, mesh, (stream,), run_check=False).redistribute(placements=(Replicate(),))
    keys = query if context is x else DTensor.from_local(context, mesh, (Replicate(),), run_check=False)
    return (query, keys, *rest)


def _attention_plan(attn: Attention, prefix: str, stream: Placement) -> dict[str, ParallelStyle]:
    plan: dict[str, ParallelStyle] = {
        f"{prefix}.{name}": ColwiseParallel() for name in ("to_q", "to_k", "to_v")
    }
    if attn.to_gate_logits is not None:  # one logit per head: a rank's heads'
        plan[f"{prefix}.to_gate_logits"] = ColwiseParallel()
    plan[f"{prefix}.to_out.0"] = RowwiseParallel(output_layouts=stream)
    return plan


def apply_tp(model: LTX2Transformer, tp_mesh: DeviceMesh, *, sequence_parallel: bool) -> None:
    """Tensor (and, with `sequence_parallel`, sequence) parallel over the 1-D `tp_mesh`, in place, before
    activation checkpointing, compile and FSDP. Weights are taken from tp rank 0, so a model initialised
    before this call keeps its values."""
    check_tp_model(model, tp_mesh.size())
    stream: Placement = Shard(SEQUENCE_DIM) if sequence_parallel else Replicate()
    for block in model.blocks.values():
        plan = _attention_plan(block.attn1, "attn1", stream) | _attention_plan(block.attn2, "attn2", stream)
        plan |= {
            "ff.net.0.proj": ColwiseParallel(input_layouts=stream),
            "ff.net.2": RowwiseParallel(output_layouts=stream),
        }
        parallelize_module(block, tp_mesh, plan)
        for attn in (block.attn1, block.attn2):
            attn.register_forward_pre_hook(partial(_replicated_inputs, tp_mesh, stream))
            attn.norm_q = HeadsSpanningRMSNorm(attn.norm_q.weight, attn.norm_q.eps, tp_mesh)
            attn.norm_k = HeadsSpanningRMSNorm(attn.norm_k.weight, attn.norm_k.eps, tp_mesh)
            attn.tp_rank = tp_mesh.get_local_rank()
    if sequence_parallel:
        apply_sequence_region(list(model.blocks.values()), tp_mesh, sum_per_sample_grads=True)
