"""Tensor and sequence parallel pieces every family's plan is made of (each family's plan is in its
package: `families/<name>/tensor_parallel.py`): the parallel styles DTensor lacks (a column-wise Linear
whose output is all-gathered, a replicated module whose gradient is left partial), the RMSNorm over a
width split across the ranks (`HeadsSpanningRMSNorm`: Wan's and LTX-2's q/k norms), the sequence-parallel
region, the checks before sharding, and the reductions of partial
gradients that FSDP does not do.

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

Order (torchtitan's): pipeline split, then the family's plan, then activation checkpointing, compile, FSDP2.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import fields
from functools import cache, partial

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import (
    DTensor,
    Partial,
    Replicate,
    Shard,
    distribute_module,
    distribute_tensor,
)
from torch.distributed.tensor.parallel.style import ParallelStyle

from vidforge.errors import UserInputError
from vidforge.models.layers import Conditioning

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


class HeadsSpanningRMSNorm(nn.Module):
    """`nn.RMSNorm` over a feature dimension split across the tp ranks (q/k norms across all heads, as Wan's
    and LTX-2's, behind column-parallel projections): the mean square of the whole row's features
    (all-reduced), each rank's shard of the weight. Built from the norm's `weight` (whole, sharded here as
    the projection's columns, so checkpoints and the export see the whole weight) and its epsilon (both
    families build their norms with one)."""

    def __init__(self, weight: torch.Tensor, epsilon: float, mesh: DeviceMesh) -> None:
        super().__init__()
        (self.features,) = weight.shape
        self.epsilon = epsilon
        self.weight = nn.Parameter(distribute_tensor(weight.detach(), mesh, [Shard(0)]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        squares = x.float().square().sum(dim=-1, keepdim=True)
        # The sum over ranks as DTensor collectives (torch.compile traces them; it cannot trace
        # torch.distributed.nn's autograd all_reduce): each rank's mean feeds only its own features, so
        # the gradients reaching it differ by rank and are declared Partial, summed on the way back.
        partial_sums = DTensor.from_local(squares, self.weight.device_mesh, (Partial(),), run_check=False)
        total = partial_sums.redistribute(placements=(Replicate(),)).to_local(grad_placements=(Partial(),))
        mean = total / self.features
        return (x.float() * torch.rsqrt(mean + self.epsilon)).type_as(x) * self.weight.to_local()

    def __deepcopy__(self, memo: dict) -> HeadsSpanningRMSNorm:
        # The weight's mesh (and its process group) cannot be copied: copies of the model (EMA, evaluation)
        # share it.
        clone = object.__new__(HeadsSpanningRMSNorm)
        nn.Module.__init__(clone)
        clone.features, clone.epsilon = self.features, self.epsilon
        clone.weight = nn.Parameter(self.weight.detach().clone(), requires_grad=self.weight.requires_grad)
        return clone


# --- sequence-parallel region ---------------------------------------------------------------------------


def _scatter_sequence(h: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    """Whole row (replicated) -> this rank's slice; the backward all-gathers the gradient."""
    full = DTensor.from_local(h, mesh, (Replicate(),), run_check=False)
    return full.redistribute(placements=(Shard(SEQUENCE_DIM),)).to_local()


def _gather_sequence(h: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    """This rank's slice -> whole row; the backward keeps the slice of the (replicated) gradient."""
    part = DTensor.from_local(h, mesh, (Shard(SEQUENCE_DIM),), run_check=False)
    return part.redistribute(placements=(Replicate(),)).to_local()


class _RankTokens:
    """A block's conditioning under sequence parallel when the block adds learned per-sample rows of its
    own to the modulation before broadcasting it (Wan's and LTX-2's `scale_shift_table`): those rows meet
    only this rank's tokens, so their gradient, and the modulation's, is this rank's part. `per_token` sums
    it over the tp ranks (identity forward, all-reduce of the (N, F) rows' gradient backward), which makes
    the table's and the time projection's gradients complete on every rank. Mixed into the family's own
    `Conditioning` class (`_rank_tokens`), so its extra fields (LTX-2's `prompt_time`) come along."""

    mesh: DeviceMesh

    def per_token(self, values: torch.Tensor) -> torch.Tensor:
        rows = DTensor.from_local(values, self.mesh, (Replicate(),), run_check=False)
        return super().per_token(rows.to_local(grad_placements=(Partial(),)))


@cache
def _rank_tokens_class(base: type[Conditioning]) -> type[Conditioning]:
    return type(f"RankTokens{base.__name__}", (_RankTokens, base), {})


def _rank_tokens(cond: Conditioning, mesh: DeviceMesh) -> Conditioning:
    rank_tokens = _rank_tokens_class(type(cond))(**{f.name: getattr(cond, f.name) for f in fields(cond)})
    rank_tokens.mesh = mesh
    return rank_tokens


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
        if cond.time.ndim == 3:
            # per-token rows are a rank's own slice: summing their gradients over the ranks would add
            # other tokens' into them (not built: the table's gradient would need its own sum)
            raise UserInputError(
                f"parallel.sequence_parallel: a noise level per token (first-frame conditioning) has no "
                f"sequence-parallel plan for these blocks (tp={tp}); set parallel.sequence_parallel=false"
            )
        cond = _rank_tokens(cond, mesh)
    return (h, cond, *args[2:]), kwargs


def _gather_output(mesh: DeviceMesh, module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
    return _gather_sequence(output, mesh)


def apply_sequence_region(blocks: list[nn.Module], mesh: DeviceMesh, *, sum_per_sample_grads: bool) -> None:
    """Make `blocks` (a model's or a pipeline stage's, in order) the sequence-parallel region: the first
    slices the row (its tokens must divide by tp), each block sees its rank's tokens and conditioning, the
    last all-gathers its output. `sum_per_sample_grads`: reduce the gradient of what blocks broadcast with
    `Conditioning.per_token` over the tp ranks (`_RankTokens`); the DiT's modulation Linear
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
