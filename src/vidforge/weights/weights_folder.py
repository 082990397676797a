"""The one reader of a weights folder a user names (`model import`, `train --init`, `infer -c`, `bench
plan --model`): a vidforge export (model.safetensors and config.json, in the folder or its export/), or a
published folder of a registered family (`vidforge.families`: e.g. a diffusers Wan download), which gives
the profile that trains and samples the weights as published. A profile that contradicts the weights
(objective, latent channels, text width, experts) is refused here, in one line, before anything loads."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from pydantic import ValidationError

from vidforge.errors import UserInputError
from vidforge.families import Published, family, load, names, read_published
from vidforge.files import weights_places
from vidforge.profile import RunProfile, load_profile
from vidforge.profile.loading import apply_overrides, validate_profile
from vidforge.profile.model import RUNTIME_FIELDS, Model
from vidforge.profile.overrides import Override, Settings, as_overrides
from vidforge.weights.checkpoint import CONFIG, WEIGHTS, read_config


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
    """`src` as an export (checked first: a run's export, or the folder itself: `files.weights_places`) or
    a published folder; None when it is neither (the caller says what it accepts)."""
    path = Path(src)
    for candidate in weights_places(path):
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
            f"{flag} {src}: no {WEIGHTS} in {', '.join(map(str, weights_places(path)))}, and not a published "
            "model folder (a diffusers transformer or pipeline download); point at a `vidforge train` or "
            "`vidforge finetune` run directory that finished, an export folder, or the downloaded model folder"
        )
    return found


def published_model(published: Published) -> Model:
    """The published network's `model` section, validated (a shape vidforge cannot build is refused) in a
    profile with its family's settings (`profile_defaults`: what every profile of the family carries)."""
    data: dict = {"model": published.model}
    apply_overrides(data, family(published.family).profile_defaults)
    return validate_profile(data, f"{published.weights / CONFIG} cannot be represented").model


def published_sets(published: Published) -> list[Override]:
    """The settings of a published folder: its whole model section (preset null, every field, the
    attention settings (`RUNTIME_FIELDS`) left to the profile), then its family's defaults (objective,
    tokenizer, text encoder, caption length, sampling)."""
    return model_sets(published_model(published)) + as_overrides(published.defaults)


def model_sets(model: Model) -> list[Override]:
    """`model` as settings: preset null and every field the weights fix (not the attention settings,
    `RUNTIME_FIELDS`, which stay the profile's), the constants of its family (`fixed_fields`) restated so
    that another family's fields of the profile do not linger."""
    fields = {**model.fixed_fields(), **model.model_dump(mode="json")}
    return [Override("model.preset", None)] + [
        Override(f"model.{k}", v) for k, v in fields.items() if k not in RUNTIME_FIELDS and k != "preset"
    ]


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


def check_sampled(model: Model, weights: Model, where: str) -> None:
    """Sampling runs the weights as they are: every model field but the attention settings
    (`RUNTIME_FIELDS`, which the network takes from the profile) must be the weights' own, or it is refused
    here, in one line, rather than silently replaced by the weights' config."""
    check_shapes(model, weights, where)
    for name in type(model).model_fields:  # the family's section (check_shapes held the family)
        if name in RUNTIME_FIELDS or getattr(model, name) == getattr(weights, name):
            continue
        if name == "preset" and model.preset is None:  # null: every field given, which are compared
            continue
        raise UserInputError(
            f"model.{name}: {where}'s weights have {getattr(weights, name)}, the profile says "
            f"{getattr(model, name)}; the weights fix it (sampling changes only {', '.join(RUNTIME_FIELDS)}), "
            "drop that setting"
        )


def weights_model(weights: WeightsFolder) -> Model:
    """The model section the weights of `weights` were saved with (an export's config.json, or the
    published network's)."""
    if weights.export is not None:
        return export_model(weights.export)
    return published_model(weights.published)


def published_profile(
    published: Published,
    overrides: Settings = (),
    profile: str | os.PathLike | None = None,
    shapes: bool = True,
) -> RunProfile:
    """The profile that trains and samples a published folder as published: `profile` (default
    local_cpu) with the folder's settings (`published_sets`), then `overrides`, which win but may not
    contradict the weights (`check_published`)."""
    prof = load_profile(profile, [*published_sets(published), *as_overrides(overrides)])
    check_published(prof, published, shapes)
    return prof


def export_profile(
    export: Path, overrides: Settings = (), profile: str | os.PathLike | None = None
) -> RunProfile:
    """The profile an export trained with (its profile.yaml, or `profile` if given, with the export's model
    fields but the attention settings) with `overrides`; its model section must describe the export's
    weights."""
    if profile is None and not (export / "profile.yaml").is_file():
        raise UserInputError(f"{export}: no profile.yaml beside the weights; pass --profile")
    if profile is None:
        prof = load_profile(export / "profile.yaml", overrides)
    else:
        prof = load_profile(profile, [*model_sets(export_model(export)), *as_overrides(overrides)])
    check_shapes(prof.model, export_model(export), str(export))
    return prof


def export_folder(src: str | os.PathLike) -> Path:
    """The export `src` names (`files.weights_places`: a run's export, or the folder itself) by its
    config.json; `src` itself when none has one (reading it then names the missing file)."""
    return next((place for place in weights_places(src) if (place / CONFIG).is_file()), Path(src))


def export_model(export: Path) -> Model:
    """An export's model section (its config.json), or a UserInputError naming the file."""
    try:
        return read_config(export)
    except (ValueError, ValidationError) as err:
        raise UserInputError(f"{err}; point at a vidforge export folder") from None


def load_published(
    published: Published,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    runtime: Model | None = None,
) -> torch.nn.Module:
    """The network of a published folder, read without importing it first (its family's loader), with
    `runtime`'s attention settings (`RUNTIME_FIELDS`) if given."""
    loader = load(_needs(published.family, "load_published"))
    return loader(published.root, device=device, dtype=dtype, runtime=runtime)


def import_published(
    published: Published, out: str | os.PathLike, profile: RunProfile, dtype: str | None = None
) -> Path:
    """Write the vidforge export of a published folder into `out` (its family's importer), with
    `profile` as its profile.yaml."""
    return load(_needs(published.family, "import_weights"))(published.root, out, profile, dtype)


def export_published(export_dir: str | os.PathLike, out: str | os.PathLike, max_shard_bytes: int) -> Path:
    """Write a vidforge export (or a run directory's: `export_folder`) in its family's published layout."""
    export = export_folder(export_dir)
    return load(_needs(export_model(export).family, "export_weights"))(export, out, max_shard_bytes)


def _needs(name: str, what: str) -> str:
    path = getattr(family(name), what)
    if path is None:
        raise UserInputError(
            f"model.family={name}: the family has no published layout ({what}); only families registered "
            "with one (e.g. wan) are read or written as published folders"
        )
    return path
