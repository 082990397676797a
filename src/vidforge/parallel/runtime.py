"""The process's place in a run: which device it computes on and which process group it is in.

`init_runtime` is the only code that picks a device and starts torch.distributed (train, infer, bench
and tokenize all call it). The device is chosen before the process group starts, from LOCAL_RANK: under
torchrun, `--nproc 8` or SLURM each rank of a node drives its own GPU (`cuda:LOCAL_RANK`, modulo the
visible devices, so a task that sees only its own GPU takes it), and `torch.cuda.set_device` makes it
the current device for NCCL and for every later `torch.cuda` call.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist

from vidforge.errors import UserInputError
from vidforge.parallel.dims import ParallelDims
from vidforge.parallel.launch import start_advice
from vidforge.profile import RunProfile
from vidforge.profile.cluster import Cluster

DeviceChoice = Literal["cuda", "cpu", "auto"]
"""What a stage asks for: `cuda` (refused when no GPU is visible), `cpu`, or `auto` (a GPU if visible)."""


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def select_device(choice: str, rank_on_node: int | None = None) -> torch.device:
    """This process's device for `choice` (see DeviceChoice): `cuda:LOCAL_RANK` (modulo the visible
    GPUs) when it is a GPU. `choice` may also be a device string with an index (`cuda:1`), used as is."""
    if choice not in ("cuda", "cpu", "auto"):
        return torch.device(choice)
    if choice == "cpu" or (choice == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UserInputError(
            "cluster.accelerator: the profile asks for CUDA but no GPU is visible; use --profile local_cpu"
        )
    index = local_rank() if rank_on_node is None else rank_on_node
    return torch.device("cuda", index % torch.cuda.device_count())


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
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if chosen.type == "cuda" else "gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    return Runtime(rank, world, local_rank(), chosen, ParallelDims(profile.layout, chosen.type))
