"""Tensor parallel for the ltx2 family (LTX-2's video transformer, `vidforge.families.ltx2.network`), on the
`tp` mesh: the Megatron split of every block, as Wan's (`vidforge.families.wan.tensor_parallel`).

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
complete on every rank because they act on replicated data.

Sequence parallel is not built for this family (the per-block table is added to the time projection after
it is broadcast to the tokens, so its gradient under SP would be a rank's tokens' only): refused at load
(`layout_rules`) and here.
"""

from __future__ import annotations

from functools import partial

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.distributed.tensor.parallel.style import ParallelStyle

from vidforge.errors import UserInputError
from vidforge.families.ltx2 import no_sequence_parallel
from vidforge.families.ltx2.network import Attention, LTX2Transformer
from vidforge.parallel.tensor_parallel import HeadsSpanningRMSNorm, check_tp_model


def _replicated_inputs(mesh: DeviceMesh, module: nn.Module, args: tuple) -> tuple:
    """Forward pre-hook of an attention called as attn(x, context, mask, rope): x and context as replicated
    DTensors, one object when they are one tensor."""
    x, context, *rest = args
    query = DTensor.from_local(x, mesh, (Replicate(),), run_check=False)
    keys = query if context is x else DTensor.from_local(context, mesh, (Replicate(),), run_check=False)
    return (query, keys, *rest)


def _attention_plan(attn: Attention, prefix: str) -> dict[str, ParallelStyle]:
    plan: dict[str, ParallelStyle] = {
        f"{prefix}.{name}": ColwiseParallel() for name in ("to_q", "to_k", "to_v")
    }
    if attn.to_gate_logits is not None:  # one logit per head: a rank's heads'
        plan[f"{prefix}.to_gate_logits"] = ColwiseParallel()
    plan[f"{prefix}.to_out.0"] = RowwiseParallel()
    return plan


def apply_tp(model: LTX2Transformer, tp_mesh: DeviceMesh, *, sequence_parallel: bool) -> None:
    """Tensor parallel over the 1-D `tp_mesh`, in place, before activation checkpointing, compile and FSDP.
    Weights are taken from tp rank 0, so a model initialised before this call keeps its values."""
    tp = tp_mesh.size()
    if sequence_parallel:
        raise UserInputError(no_sequence_parallel(tp))
    check_tp_model(model, tp)
    for block in model.blocks.values():
        plan = _attention_plan(block.attn1, "attn1") | _attention_plan(block.attn2, "attn2")
        plan |= {"ff.net.0.proj": ColwiseParallel(), "ff.net.2": RowwiseParallel()}
        parallelize_module(block, tp_mesh, plan)
        for attn in (block.attn1, block.attn2):
            attn.register_forward_pre_hook(partial(_replicated_inputs, tp_mesh))
            attn.norm_q = HeadsSpanningRMSNorm(attn.norm_q.weight, attn.norm_q.eps, tp_mesh)
            attn.norm_k = HeadsSpanningRMSNorm(attn.norm_k.weight, attn.norm_k.eps, tp_mesh)
            attn.tp_rank = tp_mesh.get_local_rank()
