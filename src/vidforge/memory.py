"""Refusing, before anything is allocated, settings that cannot fit this machine's memory.

A setting that asks for more memory than the machine has (`model.hidden=1000000`, a shuffle or packing
buffer of a billion samples, a 8192x8192 bucket, a 1024x1024 video of 65 frames on a CPU) would
otherwise be found out by the allocator, after minutes, with the machine swapping or the kernel killing
the process. Each stage instead works out the bytes its settings need, by arithmetic on the profile and
the data's index, and `require` refuses in one line naming the setting when they exceed what the machine
has. The figures are lower bounds (what is certainly needed: parameters at 2 bytes, one latent per
tensor the sampler holds), or a measured cost per item where there is no formula (the dry run's fake ranks)."""

from __future__ import annotations

import os
from pathlib import Path

from vidforge.errors import UserInputError


def host_memory_bytes() -> int:
    """Memory this process may use: the machine's RAM, or its cgroup's limit (a container's) when lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def device_memory_bytes(device: object) -> int:
    """Memory of `device` (a torch.device): a GPU's own, else the host's."""
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        return torch.cuda.get_device_properties(device).total_memory
    return host_memory_bytes()


def gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def require(need: float, have: float, what: str, fix: str) -> None:
    """UserInputError when `need` bytes (for `what`) exceed `have`; `fix` says which setting to lower."""
    if need > have:
        raise UserInputError(f"{what} needs at least {gib(need)}, more than the {gib(have)} here; {fix}")
