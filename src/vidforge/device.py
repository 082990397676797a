"""Which device a setting names: the one place a device choice (`auto`, `cuda`, `cpu`, or a device with
an index such as `cuda:1`) is resolved, for every stage (`parallel.runtime.init_runtime` for train,
infer, bench and tokenize; text encoders, curation's models and k-means). A GPU is `cuda:LOCAL_RANK`
(modulo the visible devices, so a task that sees only its own GPU takes it): under torchrun, `--nproc`
or SLURM each rank of a node drives its own GPU; a lone process takes the first."""

from __future__ import annotations

import os
from typing import Literal

import torch

from vidforge.errors import UserInputError

DeviceChoice = Literal["cuda", "cpu", "auto"]
"""What a stage asks for: `cuda` (refused when no GPU is visible), `cpu`, or `auto` (a GPU if visible)."""


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def select_device(
    choice: str, setting: str = "cluster.accelerator", rank_on_node: int | None = None
) -> torch.device:
    """This process's device for `choice` (see DeviceChoice); `setting` is the profile field it came
    from, named when `cuda` is asked for and no GPU is visible. A device with an index is used as is."""
    if choice not in ("cuda", "cpu", "auto"):
        return torch.device(choice)
    if choice == "cpu" or (choice == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        fix = "use --profile local_cpu" if setting == "cluster.accelerator" else f"set {setting}=auto or cpu"
        raise UserInputError(f"{setting}: the profile asks for CUDA but no GPU is visible; {fix}")
    index = local_rank() if rank_on_node is None else rank_on_node
    return torch.device("cuda", index % torch.cuda.device_count())
