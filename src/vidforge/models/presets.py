"""Building models from the profile's `model` section (whose PRESETS table names the shapes)."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch
from torch import nn

from vidforge.families import family, load
from vidforge.models.cpu_draws import cpu_draws
from vidforge.profile.model import PRESETS, Model


def model_config(preset: str = "tiny", **overrides: Any) -> Model:
    """A validated `Model` section from a preset name and field overrides, e.g.
    `model_config("dit-7b", layers=4)`."""
    if preset not in PRESETS:
        raise ValueError(f"preset: unknown {preset!r}; use one of {sorted(PRESETS)}")
    return Model.model_validate({"preset": preset, **overrides})


def build_model(
    config: Model, device: torch.device | str | None = None, dtype: torch.dtype | None = None
) -> nn.Module:
    """The network the section's family registers (`vidforge.families`: the DiT or ST-DiT, Wan2.1's
    transformer, ...), initialised. `device="meta"` builds without memory (for
    parallel wrappers that materialise shards later and then call `init_weights`). The initialisation is
    drawn from torch's CPU generator on every device (`cpu_draws`): a seed gives a GPU the CPU's weights
    (for models a CPU can train: up to `cpu_draws.MAX_PARAMETERS`)."""
    if not isinstance(config, Model):
        raise ValueError(
            f"build_model takes the profile's `model` section (vidforge.profile.Model), got {type(config).__name__}"
        )
    draws = cpu_draws(device, lambda: count_parameters(config))
    with torch.device(device) if device is not None else nullcontext(), draws:
        model = load(family(config.family).network)(config)
    if dtype is not None:
        model = model.to(dtype)
    return model


def count_parameters(model_or_config: nn.Module | Model) -> int:
    """Number of parameters; a config is counted on the meta device without allocating."""
    if isinstance(model_or_config, Model):
        model_or_config = build_model(model_or_config, device="meta")
    return sum(p.numel() for p in model_or_config.parameters())
