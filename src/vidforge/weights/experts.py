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
from vidforge.profile.model import Model
from vidforge.weights.checkpoint import WEIGHTS, add_config_notes, config_notes, load_model, read_config

EXPERTS = ("high", "low")
"""The experts in diffusers' order: `transformer` (t >= boundary), `transformer_2` (t < boundary)."""
LOW = "low_noise"
"""The low-noise expert's export, inside the high-noise expert's."""


def expert_range(boundary: float, expert: str) -> tuple[float, float]:
    """The flow times (low, high) an expert runs at: [boundary, 1] for `high`, [0, boundary) for `low`."""
    if expert not in EXPERTS:
        raise UserInputError(f"train.expert: use high or low, got {expert!r}")
    return (boundary, 1.0) if expert == "high" else (0.0, boundary)


def runs_high(t: float, boundary: float) -> bool:
    """Whether the high-noise expert runs at flow time t, as WanPipeline decides it: timestep >=
    boundary_ratio x 1000 (timestep = 1000 t). A relative 1e-6 forgives the rounding of t = floor(1000 t')
    / 1000 in float32 (the sampler hands the network its time in the latents' precision: timestep 900 is
    t = 0.89999998), so a timestep equal to the boundary goes to the high-noise expert, as there; the
    timesteps themselves are 1e-3 apart."""
    return t * 1000 >= boundary * 1000 * (1 - 1e-6)


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
    if expert is None or read_config(export).experts == 1:
        return export
    held = trained_expert(export)
    if held is not None:  # a one-expert run's export: that expert alone
        if held[0] != expert:
            raise UserInputError(
                f"{export}: holds the {held[0]}-noise expert alone; --init the two-expert weights it started "
                f"from ({held[1]}) for the {expert}-noise one"
            )
        return export
    if expert == "high":
        return export
    if not (export / LOW / WEIGHTS).is_file():
        raise UserInputError(
            f"{export}: a two-expert export without its low-noise expert ({LOW}/{WEIGHTS}); import the "
            "download again with `vidforge model import`"
        )
    return export / LOW


def record_expert(export: Path, expert: str, base: str | None) -> None:
    """Say in a one-expert run's export (config.json, beside `model`) which expert it holds and the
    two-expert weights (`--init`) its other expert is in."""
    add_config_notes(export, expert=expert, base=base)


def record_pair(export: Path, other: Path) -> None:
    """Say in a one-expert export (a model's or a LoRA adapter's config.json) where the other expert's
    trained export is (a curriculum training both experts, `vidforge.train.curriculum`): infer samples
    the two together rather than this one beside its --init. Kept relative, so the run can move."""
    add_config_notes(export, pair=os.path.relpath(other, export))


def paired_export(export: Path) -> Path | None:
    """The other expert's trained export `record_pair` recorded in `export`; None where none was."""
    pair = config_notes(export).get("pair")
    return (Path(export).resolve() / pair).resolve() if pair is not None else None  # past RUN/export's link


def trained_expert(export: Path) -> tuple[str, str | None] | None:
    """(the expert, the base holding the other) of a one-expert run's export; None for any other."""
    config = config_notes(export)
    return (config["expert"], config.get("base")) if "expert" in config else None


def load_export(
    export: str | os.PathLike, device: torch.device | str = "cpu", runtime: Model | None = None
) -> nn.Module:
    """An export's network (`load_model`, with `runtime`'s attention settings if given); both experts of
    a two-expert import (its `low_noise/`); a one-expert run's export of a two-expert model as it is
    (`trained_expert` says where its pair is)."""
    export = Path(export)
    model = load_model(export, device=device, runtime=runtime)
    if model.config.experts == 1 or trained_expert(export) is not None:
        return model
    if not (export / LOW / WEIGHTS).is_file():
        raise UserInputError(
            f"{export}: its model has two experts (model.experts=2) but {LOW}/ holds no low-noise expert; "
            "import the download again with `vidforge model import`"
        )
    low = load_model(export / LOW, device=device, runtime=runtime)
    return Experts(model, low, model.config.boundary_ratio)
