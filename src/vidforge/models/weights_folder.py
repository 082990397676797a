"""The one reader of a weights folder a user names (`model import`, `train --init`, `infer -c`, `bench
plan --model`): a vidforge export (model.safetensors and config.json, in the folder or its export/), or a
published folder of a registered family (`vidforge.families`: e.g. a diffusers Wan download), which gives
the profile that trains and samples the weights as published. A profile that contradicts the weights
(objective, latent channels, text width, experts) is refused here, in one line, before anything loads."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from pydantic import ValidationError

from vidforge.errors import UserInputError
from vidforge.families import Published, family, load, names, read_published
from vidforge.models.checkpoint import CONFIG, WEIGHTS, read_config
from vidforge.profile import RunProfile, load_profile
from vidforge.profile.loading import validate_profile
from vidforge.profile.model import Model

KERNELS = ("attention", "sdpa_backend")
"""Model fields that choose how the network runs, not what it is: the profile's, never the folder's."""


@dataclass(frozen=True)
class WeightsFolder:
    """What a weights folder holds: a vidforge `export`, or a family's `published` folder."""

    path: Path
    export: Path | None = None
    published: Published | None = None

    @property
    def folder(self) -> Path:
        """The folder whose weights load: the export, or the published network's folder."""
        return self.export if self.export is not None else self.published.weights


def find_weights(src: str | os.PathLike) -> WeightsFolder | None:
    """`src` as an export (checked first: the folder or its export/) or a published folder; None when
    it is neither (the caller says what it accepts)."""
    path = Path(src)
    for candidate in (path / "export", path):
        if (candidate / WEIGHTS).is_file():
            return WeightsFolder(path, export=candidate)
    published = read_published(path) if path.is_dir() else None
    return WeightsFolder(path, published=published) if published is not None else None


def resolve_weights(src: str | os.PathLike, flag: str) -> WeightsFolder:
    """`find_weights`, or a UserInputError naming `flag` and what it takes."""
    found = find_weights(src)
    path = Path(src)
    configs = [c for c in (path / CONFIG, path / "transformer" / CONFIG) if c.is_file()]
    if found is None and configs:
        try:
            name = json.loads(configs[0].read_text()).get("_class_name")
        except (ValueError, AttributeError):
            name = None
        classes = [family(n).published_class for n in names() if family(n).published_class]
        raise UserInputError(
            f"{configs[0]}: _class_name is {name!r}, not {' or '.join(classes)}; point at the transformer/ "
            "folder of a published download (or the download itself)"
        )
    if found is None:
        raise UserInputError(
            f"{flag} {src}: no {WEIGHTS} in it or in its export/, and not a published model folder (a "
            "diffusers transformer or pipeline download); point at a `vidforge train` run directory that "
            "finished, an export folder, or the downloaded model folder"
        )
    return found


def published_model(published: Published) -> Model:
    """The published network's `model` section, validated (a shape vidforge cannot build is refused)."""
    return validate_profile(
        {"model": published.model}, f"{published.weights / CONFIG} cannot be represented"
    ).model


def published_sets(published: Published) -> list[str]:
    """The `section.field=value` settings of a published folder: its whole model section (preset null,
    every field, the kernels left to the profile), then its family's defaults (objective, tokenizer,
    text encoder, caption length, guidance)."""
    section = published_model(published)
    model = {**section.fixed_fields(), **section.model_dump(mode="json")}
    sets = ["model.preset=null"]
    sets += [f"model.{k}={json.dumps(v)}" for k, v in model.items() if k not in KERNELS and k != "preset"]
    return sets + list(published.defaults)


def check_published(profile: RunProfile, published: Published, shapes: bool = True) -> None:
    """Refuse a profile that contradicts the published weights: their objective (and, for flow, their
    prediction), and with `shapes` their latent channels and text width."""
    where = published.root
    if profile.diffusion.objective != published.objective:
        raise UserInputError(
            f"diffusion.objective: {where}'s weights were trained with {published.objective}, the profile "
            f"says {profile.diffusion.objective}; drop that setting (the folder sets it)"
        )
    if published.objective == "flow" and profile.diffusion.flow_prediction != "velocity":
        raise UserInputError(
            f"diffusion.flow_prediction: {where}'s published weights predict the velocity; "
            "leave flow_prediction at velocity to train or sample them"
        )
    if shapes:
        check_shapes(
            profile.model, published_model(published), str(where), "(or pass --allow-partial to --init)"
        )


def check_shapes(model: Model, weights: Model, where: str, partial: str = "") -> None:
    """The model section's family, latent and condition channels, text and image widths, and experts
    (their count and the time they switch at) against the weights' own; `partial` says how to start
    from weights of another shape, where that is possible."""
    for name in (
        "family",
        "in_channels",
        "text_dim",
        "condition_channels",
        "image_dim",
        "experts",
        "boundary_ratio",
    ):
        if getattr(model, name) != getattr(weights, name):
            raise UserInputError(
                f"model.{name}: {where}'s weights have {getattr(weights, name)}, the profile says "
                f"{getattr(model, name)}; drop that setting {partial}".rstrip()
            )


def published_profile(
    published: Published,
    overrides: Sequence[str] = (),
    profile: str | os.PathLike | None = None,
    shapes: bool = True,
) -> RunProfile:
    """The profile that trains and samples a published folder as published: `profile` (default
    local_cpu) with the folder's settings (`published_sets`), then `overrides`, which win but may not
    contradict the weights (`check_published`)."""
    prof = load_profile(profile, [*published_sets(published), *overrides])
    check_published(prof, published, shapes)
    return prof


def export_profile(
    export: Path, overrides: Sequence[str] = (), profile: str | os.PathLike | None = None
) -> RunProfile:
    """The profile an export trained with (its profile.yaml, or `profile` if given) with `overrides`; its
    model section must describe the export's weights."""
    base = profile if profile is not None else export / "profile.yaml"
    if profile is None and not Path(base).is_file():
        raise UserInputError(f"{export}: no profile.yaml beside the weights; pass --profile")
    prof = load_profile(base, overrides)
    check_shapes(prof.model, export_model(export), str(export))
    return prof


def export_model(export: Path) -> Model:
    """An export's model section (its config.json), or a UserInputError naming the file."""
    try:
        return read_config(export)
    except (ValueError, ValidationError) as err:
        raise UserInputError(f"{err}; point at a vidforge export folder") from None


def load_published(
    published: Published, device: torch.device | str = "cpu", dtype: torch.dtype | None = None
) -> torch.nn.Module:
    """The network of a published folder, read without importing it first (its family's loader)."""
    return load(_needs(published.family, "load_published"))(published.root, device=device, dtype=dtype)


def import_published(
    published: Published, out: str | os.PathLike, profile: RunProfile, dtype: str | None = None
) -> Path:
    """Write the vidforge export of a published folder into `out` (its family's importer), with
    `profile` as its profile.yaml."""
    return load(_needs(published.family, "import_weights"))(published.root, out, profile, dtype)


def export_published(export_dir: str | os.PathLike, out: str | os.PathLike, max_shard_bytes: int) -> Path:
    """Write a vidforge export (or a run directory's) in its family's published layout."""
    export = Path(export_dir)
    if not (export / CONFIG).is_file() and (export / "export" / CONFIG).is_file():
        export = export / "export"  # a training run directory
    return load(_needs(export_model(export).family, "export_weights"))(export, out, max_shard_bytes)


def _needs(name: str, what: str) -> str:
    path = getattr(family(name), what)
    if path is None:
        raise UserInputError(
            f"model.family={name}: the family has no published layout ({what}); only families registered "
            "with one (e.g. wan) are read or written as published folders"
        )
    return path
