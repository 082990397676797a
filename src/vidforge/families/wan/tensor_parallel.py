"""Tensor parallel for the wan family (Wan2.1's transformer, `vidforge.families.wan.network`), on the `tp` mesh.

Inside every block: attention q/k/v (self and cross) and the feed-forward's first projection are
column-parallel (a rank computes its heads and its slice of the inner width; attention reads the head
count from the projection width), attention `to_out.0` and the feed-forward's `net.2` are row-parallel
(partial sums, all-reduced). Wan's q and k RMS norms normalise across *all* heads (diffusers'
`norm_q`/`norm_k` over the whole hidden size), so a rank's share cannot be normalised alone: each rank
sums the squares of its features, the sums are all-reduced (differentiably), and each rank scales its
features by the whole row's RMS and its shard of the norm weight (a DTensor sharded like the projection's
columns, so checkpoints and the export see the whole weight). Everything else (norms on the residual
stream, the modulation table, the time and text embedders, the output layer) stays replicated on the tp
ranks, with gradients that are complete on every rank because they act on replicated data (without
sequence parallel; with it, see below).

Sequence parallel (`parallel.sequence_parallel`), as for the DiT (`vidforge.parallel.tensor_parallel`,
whose `apply_sequence_region` slices the row at the first block and gathers it after the last, and
whose refusal of a row not divisible by tp holds here too): between sub-layers the residual stream
holds S/tp tokens per rank. It is all-gathered where a sub-layer's column-parallel projections read
it and reduce-scattered after the row-parallel `to_out.0` and `net.2` (torch's `RowwiseParallel` with
a sequence-sharded output). Self-attention gathers once for q, k and v (`PrepareModuleInput` on
`attn1`, whose forward runs its hooks). Cross-attention is called as `attn2.cross(...)`, which runs no
module hooks, so the gather sits on `attn2.to_q` itself (`ColwiseParallel` with a sequence-sharded
input), the one projection that reads the stream; k and v read the replicated caption. The
feed-forward's first projection gathers the same way. Attention, RoPE, packed rows' segments and the
heads-spanning norms then see whole rows, exactly as without SP.

What acts on the sharded stream gets a gradient from this rank's tokens only:
- `norm2` (the cross-attention's affine LayerNorm, when present): torch's `SequenceParallel` style
  (weights replicated DTensors, gradients `Partial`, reduced by FSDP2 or `reduce_partial_grads`).
- each block's `scale_shift_table` and, through it, time_proj and the time embedder: the block adds
  the table to time_proj's output and broadcasts the sum to its tokens (`Conditioning.per_token`).
  The table is a bare parameter read inside the block's forward, where no torch style can turn it into
  a local tensor with a `Partial` gradient, so the sum's (N, 6 hidden) gradient is all-reduced where it
  meets the tokens (`apply_sequence_region(sum_per_sample_grads=True)`). The DiT needs no such step:
  its modulation is a Linear whose style reduces the gradient.
The output layer (`norm_out`, `proj_out`, its table with temb) runs after the gather on whole rows, so
its gradients are complete.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Placement, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.distributed.tensor.parallel.style import ParallelStyle

from vidforge.families.wan.network import WanBlock, WanTransformer
from vidforge.parallel.tensor_parallel import (
    SEQUENCE_DIM,
    HeadsSpanningRMSNorm,
    apply_sequence_region,
    check_tp_model,
)


def _plan(block: WanBlock, stream: Placement) -> dict[str, ParallelStyle]:
    """One block's `parallelize_module` plan; `stream` is the residual stream's placement between
    sub-layers (sharded along the sequence under SP, else replicated)."""
    plan: dict[str, ParallelStyle] = {
        "attn1": PrepareModuleInput(
            input_layouts=(stream, None, None),
            desired_input_layouts=(Replicate(), None, None),
            use_local_output=False,
        ),
        **{f"attn1.{name}": ColwiseParallel() for name in ("to_q", "to_k", "to_v")},
        # attn2 runs through .cross (no module hooks): to_q, its one reader of the stream, gathers it
        "attn2.to_q": ColwiseParallel(input_layouts=stream),
        **{f"attn2.{name}": ColwiseParallel() for name in ("to_k", "to_v")},
        **{f"{attn}.to_out.0": RowwiseParallel(output_layouts=stream) for attn in ("attn1", "attn2")},
        "ffn.net.0.proj": ColwiseParallel(input_layouts=stream),
        "ffn.net.2": RowwiseParallel(output_layouts=stream),
    }
    if isinstance(stream, Shard) and isinstance(block.norm2, nn.LayerNorm):
        plan["norm2"] = SequenceParallel(sequence_dim=SEQUENCE_DIM, use_local_output=True)
    return plan


def apply_wan_tp(model: WanTransformer, tp_mesh: DeviceMesh, *, sequence_parallel: bool) -> None:
    """Tensor (and, with `sequence_parallel`, sequence) parallel over the 1-D `tp_mesh`, in place, before
    activation checkpointing, compile and FSDP. Weights are taken from tp rank 0, so a model initialised
    before this call keeps its values."""
    check_tp_model(model, tp_mesh.size())
    stream: Placement = Shard(SEQUENCE_DIM) if sequence_parallel else Replicate()
    for block in model.blocks.values():
        parallelize_module(block, tp_mesh, _plan(block, stream))
        for attn in (block.attn1, block.attn2):
            attn.norm_q = HeadsSpanningRMSNorm(attn.norm_q.weight, attn.norm_q.eps, tp_mesh)
            attn.norm_k = HeadsSpanningRMSNorm(attn.norm_k.weight, attn.norm_k.eps, tp_mesh)
    if sequence_parallel:
        apply_sequence_region(list(model.blocks.values()), tp_mesh, sum_per_sample_grads=True)
