"""FSDP2 (`fully_shard`) over the data-parallel (and context-parallel) ranks, applied last."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard


def apply_fsdp(
    model: nn.Module,
    mesh: DeviceMesh,
    blocks: nn.ModuleDict | nn.ModuleList,
    *,
    param_dtype: torch.dtype = torch.bfloat16,
    reduce_dtype: torch.dtype = torch.float32,
    cpu_offload: bool = False,
    reshard_after_forward: bool = True,
) -> nn.Module:
    """Shard each block, then the root (embeddings, conditioning, final layer; no blocks: the root alone,
    as the VAE fine-tune shards its VAE and discriminator). Parameters stay fp32
    (master weights); compute runs in `param_dtype`; gradients are reduced in `reduce_dtype`."""
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    kwargs = {"mesh": mesh, "mp_policy": policy}
    if cpu_offload:
        kwargs["offload_policy"] = CPUOffloadPolicy()
    modules = list(blocks.values()) if isinstance(blocks, nn.ModuleDict) else list(blocks)
    last = len(modules) - 1
    for i, block in enumerate(modules):
        # The last block's parameters are needed again at once by the backward: keep them gathered.
        fully_shard(block, reshard_after_forward=reshard_after_forward and i < last, **kwargs)
    fully_shard(model, reshard_after_forward=reshard_after_forward, **kwargs)
    return model
