"""`vidforge train --dry-run`: build a profile's whole parallel layout in one CPU process, without GPUs,
and say what each rank would hold.

torch's fake process group stands in for the cluster: this process plays one rank of the full world
size, every collective returns at once, and the model is built on the meta device (no memory). The
run is built by `vidforge train`'s own code (`vidforge.train.build`: the pipeline split, tensor/sequence
parallel, context parallel, FSDP2, EMA and optimizers; then its training step), so a layout that cannot be
built fails here, before a job waits in a queue; which layouts the trainer runs at all is the layout
rulebook's to say, when the profile loads (`vidforge.profile.layout_rules`). Parameter, gradient and optimizer bytes per rank are
counted from the sharded tensors the layout actually produced; everything else a step holds, which needs a
forward, comes from the analytic memory model of `vidforge bench plan` (vidforge.estimate.memory_model):
activations, the recomputed block, weight copies, communication buffers and the backward's overlap of
activations and gradients. So the dry run's total is the plan's with the states counted rather than
computed: the two differ by FSDP's padding of uneven shards only. Ranks differ only by pipeline stage, so
one rank per stage is built.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from vidforge.memory import host_memory_bytes, require
from vidforge.parallel.dims import ParallelDims
from vidforge.profile import RunProfile

ADAM_STATES = 2
FAKE_RANK_BYTES = 1024


@dataclass
class StageMemory:
    """What one rank of pipeline stage `stage` holds (bytes, except the counts)."""

    stage: int
    rank: int
    blocks: list[int]
    parameters: int  # parameters held by this rank (local shards)
    parameter_bytes: float  # float32 master weights (LoRA: the frozen base in its dtype + adapters)
    gradient_bytes: float
    optimizer_bytes: float  # AdamW exp_avg and exp_avg_sq, float32
    ema_bytes: float
    activation_bytes: float  # the memory model's activations (checkpointing and offload included)
    model_parameter_bytes: float  # the memory model's parameter figure, to compare with the counted one
    total_bytes: float
    model_terms: dict[str, float]  # the memory model's other terms in the total (recompute, copies, ...)
    host_bytes: float = 0.0  # what block swap keeps in host memory (under FSDP2 the blocks' adapters too)
    offloaded_bytes: float = 0.0  # saved tensors (and checkpoint inputs) the offloads keep in host memory


@dataclass
class DryRun:
    profile: str
    layout: str
    world_size: int
    stages: list[StageMemory]
    notes: list[str]

    def as_dict(self) -> dict:
        return asdict(self)


def _local_numel(t: torch.Tensor) -> int:
    return t.to_local().numel() if isinstance(t, DTensor) else t.numel()


def _build_rank(profile: RunProfile, rank: int) -> tuple[int, int, float, float, int, list[int]]:
    """Build rank `rank`'s part of the run on a fake process group, exactly as `vidforge train` builds it
    (`vidforge.train.build.build` and its training step), with the weights on the meta device; returns
    (local parameters, trainable ones on the device, device bytes of the parameters, frozen bytes block
    swap keeps on the host, trainable weights it keeps there, block indices it holds)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from vidforge.parallel.runtime import Runtime
    from vidforge.train.build import build
    from vidforge.train.make_step import make_train_step

    dims = ParallelDims(profile.layout, "cpu")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=dims.world_size)
    try:
        runtime = Runtime(rank, dims.world_size, 0, torch.device("meta"), dims)
        parts = build(profile, runtime)
        make_train_step(profile, runtime, parts)
        from vidforge.memory_savers.block_swap import SwappedBlock
        from vidforge.parallel.fsdp import on_host

        params, trainable, param_bytes, blocks = 0, 0, 0.0, []
        seen: set[int] = set()
        swapped: list[float] = []  # each swapped block's frozen bytes: on the host between its uses
        # trainable weights FSDP2 keeps on the host (a swapped block's adapters), and their bytes
        hosted, hosted_bytes = 0, 0.0
        for part in parts.modules:
            blocks += [int(k) for k in part.blocks.keys()]
            for block in part.blocks.values():
                if isinstance(block, SwappedBlock):
                    frozen = block.swapper.weights[block.index].params
                # under FSDP2, block swap's blocks alone keep their shards on the host (the root there too
                # is train.fsdp_cpu_offload, which the memory model states as a note)
                elif on_host(block) and not on_host(part):
                    frozen = [p for p in block.parameters() if not p.requires_grad]
                    adapters = [p for p in block.parameters() if p.requires_grad]
                    hosted += sum(_local_numel(p) for p in adapters)
                    hosted_bytes += sum(_local_numel(p) * p.element_size() for p in adapters)
                else:
                    continue
                swapped.append(sum(_local_numel(w) * w.element_size() for w in frozen))
            for p in part.parameters():
                if id(p) not in seen:  # a conditioning parameter is in every local stage module once
                    seen.add(id(p))
                    params += _local_numel(p)
                    param_bytes += _local_numel(p) * p.element_size()
                    trainable += _local_numel(p) if p.requires_grad else 0  # LoRA: the adapters alone
        # every swapped block's pinned host copy stays; at most two of them also have a device copy at
        # once (`BlockSwapper.arrive`; under FSDP2 the shards of the block all-gathered and the one prefetched)
        host = sum(swapped)
        device = param_bytes - host + sum(sorted(swapped)[-2:]) - hosted_bytes
        return params, trainable - hosted, device, host, hosted, sorted(blocks)
    finally:
        dist.destroy_process_group()


def dry_run(profile: RunProfile) -> DryRun:
    """Build one rank per pipeline stage of `profile`'s layout on a fake process group."""
    from vidforge.estimate.memory_model import estimate_memory
    from vidforge.estimate.recompute import resolve_auto
    from vidforge.estimate.workload import Workload

    profile, recompute = resolve_auto(profile)
    if dist.is_initialized():
        raise RuntimeError("--dry-run builds its own fake process group: run it in a single process")
    from vidforge.train.distill import student_profile

    profile = student_profile(profile)  # a distillation trains with it, as `vidforge train` does
    layout = profile.layout
    dims = ParallelDims(layout, "cpu")
    # torch's DeviceMesh lists every rank of every group it makes, fake ones too: cluster.nodes=100000000
    # went past 3 GB in seconds. About 1 KB a rank, measured (80,000 ranks: +16 MB and 20 s).
    require(
        dims.world_size * FAKE_RANK_BYTES,
        host_memory_bytes(),
        f"a dry run of {dims.world_size:,} ranks (about {FAKE_RANK_BYTES} bytes of group bookkeeping each)",
        "lower cluster.nodes or cluster.gpus_per_node",
    )
    estimate = estimate_memory(profile, layout)
    ema = profile.train.ema_decay > 0
    stages = []
    per_stage = dims.world_size // layout.pp
    for stage in range(layout.pp):
        rank = stage * per_stage
        params, trainable, weights, host, hosted, blocks = _build_rank(profile, rank)
        grads = 4.0 * trainable  # float32 gradients, AdamW states and EMA of what trains
        # the adapters FSDP2 keeps on the host: their weights, gradients, AdamW states and EMA
        host += 4.0 * hosted * (2 + ADAM_STATES + (1 if ema else 0))
        activations = estimate.get("activations")
        others: dict[str, float] = {}
        for term in estimate.terms:
            if term.name not in ("parameters", "gradients", "optimizer", "ema"):
                others[term.name] = others.get(term.name, 0.0) + term.bytes
        total = weights + grads * (1 + ADAM_STATES + (1 if ema else 0)) + sum(others.values())
        stages.append(
            StageMemory(
                stage=stage,
                rank=rank,
                blocks=blocks,
                parameters=params,
                parameter_bytes=weights,
                gradient_bytes=grads,
                optimizer_bytes=ADAM_STATES * grads,
                ema_bytes=grads if ema else 0.0,
                activation_bytes=activations,
                model_parameter_bytes=estimate.get("parameters"),
                total_bytes=total,
                model_terms=others,
                host_bytes=host,
                offloaded_bytes=estimate.offloaded_bytes,
            )
        )
    notes = [
        "parameters, gradients, optimizer and EMA: counted from the local shards the layout produced; the "
        f"rest from the memory model, whose total is {estimate.total / 2**30:.2f} GiB (the two differ by "
        "FSDP's padding of uneven shards)",
        f"activations: vidforge bench plan's memory model for {Workload.from_profile(profile).describe()} "
        "per data-parallel rank (the profile's bench section)",
        *([recompute.describe()] if recompute is not None else []),
    ]
    return DryRun(profile.name, layout.describe(), dims.world_size, stages, notes)
