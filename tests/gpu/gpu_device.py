"""The device the `gpu` tests run on: CUDA, or the CPU when VIDFORGE_GPU_TESTS_DEVICE=cpu (to check the
tests themselves without a GPU: the comparisons then hold trivially, but every code path runs)."""

from __future__ import annotations

import os

import torch

DEVICE = torch.device(os.environ.get("VIDFORGE_GPU_TESTS_DEVICE", "cuda"))


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref||, in float64 on the CPU."""
    out, ref = out.detach().double().cpu(), ref.detach().double().cpu()
    return float((out - ref).norm() / ref.norm())
