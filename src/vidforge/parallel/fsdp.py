"""FSDP2 (`fully_shard`) over the data-parallel (and context-parallel) ranks, applied last."""

from __future__ import annotations

import weakref
from collections.abc import Collection

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

# The modules `apply_fsdp` gave FSDP2's CPUOffloadPolicy: what `on_host` answers from (FSDP2 keeps the
# policy in private state only).
_ON_HOST: weakref.WeakSet[nn.Module] = weakref.WeakSet()


def apply_fsdp(
    model: nn.Module,
    mesh: DeviceMesh,
    blocks: nn.ModuleDict | nn.ModuleList,
    *,
    param_dtype: torch.dtype = torch.bfloat16,
    reduce_dtype: torch.dtype = torch.float32,
    cpu_offload: bool = False,
    reshard_after_forward: bool = True,
    host_blocks: Collection[int] = (),
) -> nn.Module:
    """Shard each block, then the root (embeddings, conditioning, final layer; no blocks: the root alone,
    as the VAE fine-tune shards its VAE and discriminator). Parameters stay fp32 (master weights); they are
    all-gathered in `param_dtype`, and the forward runs under autocast to it (`parallelize.forward_dtype`),
    as one process's does; gradients are reduced in `reduce_dtype`.

    FSDP2 would also cast every floating-point argument of each wrapped module's forward, a dataclass's
    fields included, to `param_dtype` (`cast_forward_inputs`): the RoPE tables and the timestep rows the
    networks compute in float32 (diffusers' RoPE is float32), which one process keeps float32 under
    autocast, would reach every block in bf16. Off: a block sees what the layer before it made, and
    autocast casts the matmuls' inputs as it does in one process.

    `host_blocks` (block swap under FSDP2, `train.lora.blocks_to_swap`): these blocks' shards live in
    pinned host memory (FSDP2's CPUOffloadPolicy for these blocks alone), copied to the device as the
    all-gather's input, and each is all-gathered one block ahead, while the block before it computes
    (the forward prefetch set here; FSDP2's backward prefetches one block ahead in reverse order
    itself). A LoRA block's frozen base has no gradients: what crosses the link back is the adapters'
    sharded gradients, and their AdamW step runs on the host."""
    policy = MixedPrecisionPolicy(
        param_dtype=param_dtype, reduce_dtype=reduce_dtype, cast_forward_inputs=False
    )
    host = CPUOffloadPolicy(pin_memory=mesh.device_type == "cuda")  # pinning needs a GPU
    modules = list(blocks.values()) if isinstance(blocks, nn.ModuleDict) else list(blocks)
    last = len(modules) - 1
    for i, block in enumerate(modules):
        offload: OffloadPolicy = host if cpu_offload or i in host_blocks else OffloadPolicy()
        if offload is host:
            _ON_HOST.add(block)
        # The last block's parameters are needed again at once by the backward: keep them gathered.
        fully_shard(
            block,
            mesh=mesh,
            mp_policy=policy,
            offload_policy=offload,
            reshard_after_forward=reshard_after_forward and i < last,
        )
    for i in sorted(host_blocks):
        if 0 < i <= last:
            modules[i - 1].set_modules_to_forward_prefetch([modules[i]])  # type: ignore[operator]
    if cpu_offload:
        _ON_HOST.add(model)
    fully_shard(
        model,
        mesh=mesh,
        mp_policy=policy,
        offload_policy=host if cpu_offload else OffloadPolicy(),
        reshard_after_forward=reshard_after_forward,
    )
    return model


def on_host(module: nn.Module) -> bool:
    """Whether `module`'s FSDP2 shards live in host memory (`apply_fsdp`'s host_blocks or cpu_offload)."""
    return module in _ON_HOST
