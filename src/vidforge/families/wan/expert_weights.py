"""Wan2.2 A14B's two experts in and out of diffusers' pipeline layout (transformer/: high noise,
transformer_2/: low noise; `vidforge.families.wan.experts`), the wan family's importer and loader of a
published folder: a one-expert (Wan2.1) folder goes through `vidforge.families.wan.weights`."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from vidforge.families.wan import read_json
from vidforge.families.wan.experts import FOLDERS, boundary_of
from vidforge.families.wan.weights import import_wan, load_diffusers_wan
from vidforge.profile import RunProfile
from vidforge.profile.model import Model
from vidforge.weights.experts import LOW, Experts


def import_wan_experts(
    src: str | os.PathLike, out: str | os.PathLike, profile: RunProfile, dtype: str | None = None
) -> Path:
    """`import_wan` of the download at `src`; of a two-expert one (profile.model.experts=2) the high-noise
    expert into `out` and the low-noise one into `out`/low_noise."""
    written = import_wan(src, out, profile, dtype)
    if profile.model.experts == 2:
        import_wan(Path(src) / FOLDERS["low"], written / LOW, profile, dtype)
    return written


def load_wan_experts(
    src: str | os.PathLike,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    runtime: Model | None = None,
) -> torch.nn.Module:
    """`load_diffusers_wan` of the download at `src` (with `runtime`'s attention settings if given); both
    experts of a two-expert one."""
    high = load_diffusers_wan(src, device, dtype, runtime)
    boundary = boundary_of(Path(src), read_json)
    if boundary is None:
        return high
    return Experts(high, load_diffusers_wan(Path(src) / FOLDERS["low"], device, dtype, runtime), boundary)
