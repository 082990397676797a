"""A two-expert model (`model.experts=2`, Wan2.2 A14B): two networks of one shape, the high-noise expert
run at flow times t >= `model.boundary_ratio`, the low-noise one below (diffusers' WanPipeline's
`transformer` and `transformer_2`). An export of one holds the high-noise expert in the export folder and
the low-noise one in its `low_noise/` (`vidforge model import` writes both)."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from vidforge.errors import UserInputError
from vidforge.families.wan_experts import runs_high
from vidforge.models.checkpoint import WEIGHTS, load_model, read_config

LOW = "low_noise"
"""The low-noise expert's export, inside the high-noise expert's."""


class Experts(nn.Module):
    """The two experts; `expert(t)` is the one that runs at flow time t (as WanPipeline picks it)."""

    def __init__(self, high: nn.Module, low: nn.Module, boundary: float):
        super().__init__()
        self.high, self.low, self.boundary = high, low, boundary
        self.config = high.config

    def expert(self, t: float) -> nn.Module:
        return self.high if runs_high(t, self.boundary) else self.low

    def forward(self, x: torch.Tensor, noise_level: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        """The expert of the call's time (every row at one time, as sampling calls it)."""
        return self.expert(float(noise_level.reshape(-1)[0]))(x, noise_level, *args, **kwargs)


def expert_export(export: Path, expert: str | None) -> Path:
    """The export folder of `expert` (`high`: the export itself; `low`: its low_noise/); a one-expert
    export, or None, is the export."""
    if expert != "low" or read_config(export).experts == 1:
        return export
    if not (export / LOW / WEIGHTS).is_file():
        raise UserInputError(
            f"{export}: a two-expert export without its low-noise expert ({LOW}/{WEIGHTS}); import the "
            "download again with `vidforge model import`"
        )
    return export / LOW


def load_export(export: str | os.PathLike, device: torch.device | str = "cpu") -> nn.Module:
    """An export's network (`load_model`), or both experts of a two-expert one."""
    export = Path(export)
    model = load_model(export, device=device)
    if model.config.experts == 1:
        return model
    if not (export / LOW / WEIGHTS).is_file():
        raise UserInputError(
            f"{export}: its model has two experts (model.experts=2) but {LOW}/ holds no low-noise expert; a "
            "run that trained one expert samples as a LoRA on the download (infer -c DOWNLOAD --lora RUN)"
        )
    return Experts(model, load_model(export / LOW, device=device), model.config.boundary_ratio)
