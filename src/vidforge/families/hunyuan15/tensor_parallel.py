"""Tensor parallel for the hunyuan15 family (HunyuanVideo-1.5's transformer,
`vidforge.families.hunyuan15.network`), on the `tp` mesh: the Megatron split of each double-stream block.

The joint attention's video projections (to_q/to_k/to_v) and caption projections (add_q/k/v_proj) are
column-parallel: a rank computes its heads of both streams, and the one attention over [video, caption]
runs on those heads (it reads the head count from the projection width). Its q/k RMSNorms are per head
(`RMSNorm(head_dim)`), so a rank normalises its heads alone; their weights (shared by the heads) are
replicated DTensors whose gradients sum over the ranks' heads (torch's `SequenceParallel` style over the
heads dimension, as the vidforge family's QK norms). RoPE's tables are per head channel, the same for
every head. `to_out.0` and `to_add_out` project each stream's part back row-parallel (partial sums,
all-reduced); each stream's feed-forward splits the same way (`net.0.proj` column-, `net.2` row-parallel).
The video and the caption each enter the attention once as a replicated DTensor, so the three
projections that read one share one all-reduce of its gradient.

Each stream's modulation (`norm1.linear`, `norm1_context.linear`: hidden -> 6 hidden, a third of a
block's weights) is column-parallel with its per-sample output all-gathered again
(`GatheredColwiseParallel`, as the vidforge family's): tiny to compute and to gather, large to hold.
Everything else stays replicated on the tp ranks, with gradients that are complete on every rank because
it acts on replicated data: the LayerNorms, the caption's embedders and token refiner, the time
embedding, the output layer.

Sequence parallel is not built for this family: the residual stream is [video, caption] in one row, which
an even split along the sequence would cut across the two streams. Refused at load (`layout_rules`) and
here.
"""

from __future__ import annotations

from functools import partial

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.distributed.tensor.parallel.style import ParallelStyle

from vidforge.errors import UserInputError
from vidforge.families.hunyuan15 import no_sequence_parallel
from vidforge.families.hunyuan15.network import HunyuanVideo15Transformer
from vidforge.parallel.tensor_parallel import GatheredColwiseParallel, check_tp_model

HEADS_DIM = 2  # q and k are (B, S, heads, head_dim) where the norms see them


def _replicated_streams(mesh: DeviceMesh, module: nn.Module, args: tuple) -> tuple:
    """Forward pre-hook of the joint attention, called as attn(video, text, cond)."""
    video, text, *rest = args
    return (
        DTensor.from_local(video, mesh, (Replicate(),), run_check=False),
        DTensor.from_local(text, mesh, (Replicate(),), run_check=False),
        *rest,
    )


def block_plan() -> dict[str, ParallelStyle]:
    """One double-stream block's `parallelize_module` plan."""
    plan: dict[str, ParallelStyle] = {
        f"attn.{name}": ColwiseParallel()
        for name in ("to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj")
    }
    plan |= {f"attn.{name}": RowwiseParallel() for name in ("to_out.0", "to_add_out")}
    plan |= {
        f"attn.{name}": SequenceParallel(sequence_dim=HEADS_DIM, use_local_output=True)
        for name in ("norm_q", "norm_k", "norm_added_q", "norm_added_k")
    }
    for ff in ("ff", "ff_context"):
        plan |= {f"{ff}.net.0.proj": ColwiseParallel(), f"{ff}.net.2": RowwiseParallel()}
    # each stream's modulation (hidden -> 6 hidden, a third of the block's weights): split by columns, its
    # per-sample output gathered again (complete gradients: it acts on the replicated time embedding)
    return plan | {
        f"{norm}.linear": GatheredColwiseParallel(partial_grad=False) for norm in ("norm1", "norm1_context")
    }


def apply_tp(model: HunyuanVideo15Transformer, tp_mesh: DeviceMesh, *, sequence_parallel: bool) -> None:
    """Tensor parallel over the 1-D `tp_mesh`, in place, before activation checkpointing, compile and FSDP.
    Weights are taken from tp rank 0, so a model initialised before this call keeps its values."""
    tp = tp_mesh.size()
    if sequence_parallel:
        raise UserInputError(no_sequence_parallel(tp))
    check_tp_model(model, tp)
    for block in model.blocks.values():
        parallelize_module(block, tp_mesh, block_plan())
        block.attn.register_forward_pre_hook(partial(_replicated_streams, tp_mesh))
