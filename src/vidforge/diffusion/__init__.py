"""Diffusion as pure math: objectives (EDM, rectified flow) with their preconditioning and loss targets,
their schedules and samplers (`vidforge.sampler_registry` names them all), classifier-free guidance. No weights live here.

The names below load on first use, so that importing one module of the package loads no torch it does
not need."""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "EDM": "vidforge.diffusion.edm",
    "Denoiser": "vidforge.diffusion.objective",
    "Objective": "vidforge.diffusion.objective",
    "build_objective": "vidforge.diffusion.from_profile",
    "sample": "vidforge.diffusion.from_profile",
    "classifier_free_guidance": "vidforge.diffusion.guidance",
    "heun_sampler": "vidforge.diffusion.samplers",
    "res_sampler": "vidforge.diffusion.samplers",
    "karras_sigmas": "vidforge.diffusion.schedule",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'vidforge.diffusion' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
