"""Everything parallel applied to a built model, in one fixed order (torchtitan's `parallelize`):

    float8 linears -> tensor/sequence parallel -> context parallel -> activation checkpointing
    -> activation offload -> compile -> block swap -> FSDP2 (over dp_shard x cp, HSDP with dp_replicate)

Block swap in one process wraps the swapped blocks (`apply_block_swap`); under FSDP2 it is FSDP2's own CPU
offload of those blocks' shards (`apply_fsdp`'s host_blocks), each rank holding 1/N of each block.

Why this order: float8 swaps Linear classes that TP then shards; TP must see plain Linears (not
checkpoint wrappers or compiled modules); context parallel only swaps parameter-free attention modules;
checkpointing and offloading wrap whole blocks, so they come after anything that rewrites a block's
inside; FSDP wraps last, around the final module tree, so it gathers exactly the parameters each block
uses. Pipeline parallel splits the model before all of this (each stage module is parallelized alone).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule

from vidforge.memory_savers.activation_checkpoint import apply_activation_checkpointing
from vidforge.memory_savers.activation_offload import apply_activation_offload
from vidforge.memory_savers.block_swap import apply_block_swap, swapped_indices
from vidforge.parallel.dims import ParallelDims
from vidforge.parallel.fsdp import apply_fsdp
from vidforge.profile import RunProfile
from vidforge.profile.parallel import Parallel


@dataclass
class Parallelized:
    """What was applied, for the run's notes (the caller autocasts the forward to `autocast_dtype`)."""

    notes: list[str] = field(default_factory=list)


def parallelize(
    model: nn.Module, dims: ParallelDims, profile: RunProfile, device: torch.device
) -> Parallelized:
    """Apply the profile's parallel layout and memory options to `model` (a DiT or a pipeline stage of
    one) in place."""
    cfg = profile.train
    done = Parallelized()
    if cfg.fp8:
        from vidforge.parallel.float8 import apply_float8

        converted = apply_float8(model, device, cfg.fp8_recipe)
        done.notes.append(f"fp8: {len(converted)} linear layers in float8 ({cfg.fp8_recipe} scaling)")
    if dims.tp_enabled:
        apply_tensor_parallel(model, dims, profile)
    if dims.cp_enabled:
        apply_context_parallel(model, dims, profile.parallel)
    policies = apply_activation_checkpointing(
        model.blocks, cfg.activation_checkpointing, cfg.checkpoint_ratio, cfg.checkpoint_ops_ratio
    )
    if cfg.activation_checkpointing == "selective" and policies:
        done.notes.append(
            "activation checkpointing: "
            + ", ".join(f"{policies.count(p)} blocks {p}" for p in ("full", "ops", "none") if p in policies)
        )
    apply_activation_offload(
        model.blocks,
        cfg.activation_offload,
        cfg.activation_checkpointing,
        cfg.checkpoint_ratio,
        cfg.checkpoint_offload,
        cfg.checkpoint_ops_ratio,
    )
    if cfg.compile:
        compile_blocks(model.blocks)
    # block swap (train.lora.blocks_to_swap): one process swaps whole weights, around every other wrapper;
    # under FSDP2 each rank holds only its shards, and FSDP2 keeps the swapped blocks' shards on the host
    swap = cfg.lora.blocks_to_swap if cfg.lora is not None else 0
    host_blocks = swapped_indices(len(model.blocks), swap) if swap and uses_fsdp(dims) else []
    if swap and not host_blocks:
        n = len(apply_block_swap(model.blocks, swap, device).order)  # type: ignore[union-attr]
        done.notes.append(f"block swap: the frozen weights of the last {n} blocks wait in host memory")
    if host_blocks:
        done.notes.append(
            f"block swap: the last {len(host_blocks)} blocks' FSDP2 shards wait in host memory, each "
            "all-gathered one block ahead"
        )
    if uses_fsdp(dims):
        # Under pipeline parallel a stage runs every micro-batch's forward before its backwards (GPipe) or
        # interleaved with them (1F1B): resharding after each forward would all-gather the stage's weights
        # again for every micro-batch. Kept gathered, they are gathered once a step (torchtitan does the same).
        apply_fsdp(
            model,
            dims.fsdp_mesh(),
            model.blocks,
            param_dtype=compute_dtype(profile),
            cpu_offload=cfg.fsdp_cpu_offload,
            reshard_after_forward=not dims.pp_enabled,
            host_blocks=host_blocks,
        )
    return done


def compile_blocks(blocks: nn.ModuleDict) -> None:
    """torch.compile every block, in place. A checkpointed block is compiled with its checkpoint (dynamo
    traces the recompute as one higher-order op, and the compiled backward recomputes fused); an offloaded
    block is compiled inside its wrapper, whose saved-tensor hooks dynamo cannot trace (they would break
    the graph and run the whole block eagerly) but which see the compiled graph's saved tensors all the
    same. Blocks share one compiled graph: their parameters are graph inputs, not guarded constants."""
    from vidforge.memory_savers.activation_offload import OffloadedBlock

    for key, block in blocks.items():
        if isinstance(block, OffloadedBlock):
            block._checkpoint_wrapped_module = torch.compile(block._checkpoint_wrapped_module)
        else:
            blocks[key] = torch.compile(block)


def apply_tensor_parallel(model: nn.Module, dims: ParallelDims, profile: RunProfile) -> None:
    """The model family's tensor-parallel plan (`FamilySpec.tensor_parallel`) over `dims.mesh["tp"]` (with the profile's sequence
    parallel), in place. Training (`parallelize`) and `vidforge infer` (infer.tp) both apply it here."""
    from vidforge.families import family, load
    from vidforge.profile.layout_rules import sequence_parallel

    plan = load(family(profile.model.family).tensor_parallel)
    plan(model, dims.mesh["tp"], sequence_parallel=sequence_parallel(profile))


def apply_context_parallel(model: nn.Module, dims: ParallelDims, parallel: Parallel) -> None:
    """Context parallel over `dims.mesh["cp"]` with `parallel.cp_impl`, in place: the one place that maps
    a cp_impl to the code that installs it (st-hybrid and st-spatial for an ST-DiT; the full-attention implementations,
    usp with its Ulysses and ring sub-groups, through `apply_cp`). Training and context-parallel sampling
    both come here."""
    impl = parallel.cp_impl
    if impl == "st-hybrid":
        from vidforge.parallel.stdit_parallel import apply_st_hybrid

        apply_st_hybrid(model, dims.mesh["cp"])
    elif impl == "st-spatial":
        from vidforge.parallel.st_spatial import apply_st_spatial

        apply_st_spatial(model, dims.mesh["cp"])
    else:
        from vidforge.parallel.context_parallel import apply_cp
        from vidforge.parallel.usp_attention import UspGroups

        usp = UspGroups(*dims.cp_2d_groups(parallel.cp_ulysses)) if impl == "usp" else None
        apply_cp(model, dims.mesh["cp"], impl, parallel.cp_regather, usp)


def uses_fsdp(dims: ParallelDims) -> bool:
    """FSDP2 wraps the model when weights are sharded (dp_shard x cp) or replicated over dp ranks."""
    return dims.fsdp_enabled or dims.dp_enabled


def shards_on_host(profile: RunProfile, dims: ParallelDims) -> bool:
    """Whether FSDP2 keeps shards in host memory: train.fsdp_cpu_offload, or block swap under FSDP2. Their
    gradient norms and the export's gathers are collectives over CPU tensors, so the process group needs
    gloo beside NCCL (`init_runtime`; torchtitan's "cuda:nccl,cpu:gloo" for its CPU offload)."""
    lora = profile.train.lora
    swap = lora is not None and lora.blocks_to_swap > 0
    return uses_fsdp(dims) and (profile.train.fsdp_cpu_offload or swap)


def compute_dtype(profile: RunProfile) -> torch.dtype:
    """What a training step computes in (`train.precision`): bf16 or fp32. Decided here alone: FSDP's
    parameter dtype, autocast's, the activations pipeline stages send, LoRA's frozen base."""
    return torch.bfloat16 if profile.train.precision == "bf16" else torch.float32


def reduced_dtype(profile: RunProfile) -> torch.dtype | None:
    """The compute dtype where it is below the fp32 weights (bf16), None in fp32: nothing to cast."""
    dtype = compute_dtype(profile)
    return None if dtype == torch.float32 else dtype


def autocast_dtype(profile: RunProfile) -> torch.dtype | None:
    """The dtype to autocast the forward to: bf16 (fp32 weights, or FSDP2's bf16 copies of them: it casts
    no forward inputs, `parallel.fsdp.apply_fsdp`), None in fp32. Known before the model exists, which the
    pipeline needs."""
    return reduced_dtype(profile)


def forward_dtype(model: nn.Module, profile: RunProfile) -> torch.dtype | None:
    """What a forward outside the training step (validation's sampling) autocasts `model` to: where
    `parallelize` wrapped it in FSDP2, the training step's `autocast_dtype`, since FSDP2 all-gathers its
    weights in `compute_dtype` and casts no forward inputs (`apply_fsdp`); None for a model FSDP2 does not
    wrap, which runs in its parameters' dtype as it is."""
    return autocast_dtype(profile) if isinstance(model, FSDPModule) else None
