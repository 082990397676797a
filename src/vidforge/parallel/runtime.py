"""The process's place in a run: which device it computes on and which process group it is in.

`init_runtime` is the only code that starts torch.distributed (train, infer, bench and tokenize all call
it). The device is chosen (`vidforge.device.select_device`: `cuda:LOCAL_RANK` for a GPU) before the
process group starts, and `torch.cuda.set_device` makes it the current device for NCCL and for every
later `torch.cuda` call.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from vidforge.device import local_rank, select_device
from vidforge.errors import UserInputError
from vidforge.parallel.dims import ParallelDims
from vidforge.parallel.launch import start_advice
from vidforge.profile import RunProfile
from vidforge.profile.cluster import Cluster


@dataclass
class Runtime:
    """This process in the run: global rank and world size, rank on its node, device, and the layout's
    `ParallelDims` (whose mesh is built on first use)."""

    rank: int
    world: int
    local_rank: int
    device: torch.device
    dims: ParallelDims

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def require_layout(self, cluster: Cluster | None = None) -> None:
        """Refuse a world that is not the layout's size (train and bench train run exactly the layout),
        saying how the profile's ranks start (`cluster.launcher`; `--nproc` when no cluster is given)."""
        if self.world != self.dims.world_size:
            ranks = self.dims.world_size
            advice = start_advice(cluster, ranks) if cluster is not None else f"use --nproc {ranks}"
            raise UserInputError(
                f"the layout {self.dims.layout.describe()} needs {ranks} rank(s) but {self.world} started; "
                f"{advice}; or change cluster/parallel in the profile"
            )


def init_runtime(profile: RunProfile, device: str | None = None) -> Runtime:
    """Pick the device (`device`, else the profile's accelerator: `cuda` or `cpu`) and join the process
    group torchrun or SLURM set up (NCCL on GPUs, gloo on CPUs); a single process starts none. Safe to
    call again in a process whose group is already up."""
    choice = device or profile.cluster.accelerator.kind
    chosen = select_device(choice)
    if chosen.type == "cuda":
        torch.cuda.set_device(chosen)  # before the group: NCCL binds each rank to the current device
    world = int(os.environ.get("WORLD_SIZE", "1"))
    dims = ParallelDims(profile.layout, chosen.type)
    if world > 1 and not dist.is_initialized():
        from vidforge.parallel.parallelize import shards_on_host

        backend = "gloo"
        if chosen.type == "cuda":  # shards in host memory: their collectives run on gloo
            backend = "cuda:nccl,cpu:gloo" if shards_on_host(profile, dims) else "nccl"
        dist.init_process_group(backend)
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    return Runtime(rank, world, local_rank(), chosen, dims)
