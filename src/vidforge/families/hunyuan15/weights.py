"""HunyuanVideo-1.5 weights between diffusers' folder layout and vidforge's export, one tensor at a time.

The network's parameter names are diffusers' own (`network`), so import (a diffusers transformer or
pipeline folder -> model.safetensors and config.json) and export (the reverse, a folder
`HunyuanVideo15Transformer3DModel.from_pretrained` loads with no missing or unexpected keys) copy tensors
by name with their bytes untouched (an import may cast on request): import then export gives every tensor
back bitwise. Names and shapes are checked against the network built on the meta device first."""

from __future__ import annotations

from contextlib import ExitStack
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

from vidforge.errors import UserInputError
from vidforge.families.hunyuan15.model import HunyuanVideo15Model
from vidforge.families.hunyuan15.network import HunyuanVideo15Transformer
from vidforge.families.hunyuan15.published import CONFIG, model_fields, read_json, transformer_folder
from vidforge.families.hunyuan15.published import diffusers_config as published_config
from vidforge.files import output_folder, write_text
from vidforge.profile import dump_profile
from vidforge.profile.loading import validate_profile
from vidforge.profile.model import with_runtime
from vidforge.weights.checkpoint import FORMAT, WEIGHTS, write_config
from vidforge.weights.safetensors_stream import (
    DIFFUSERS_INDEX,
    DIFFUSERS_SINGLE,
    StoredTensor,
    lazy_entries,
    stored_tensors,
    write_diffusers_folder,
    write_safetensors,
)

CASTS = {None: None, "float32": "F32", "bfloat16": "BF16"}


def _checked(model: HunyuanVideo15Model, stored: dict[str, StoredTensor], folder: Path) -> list[str]:
    """The network's tensor names in its order, after checking the stored names, shapes and dtypes."""
    with torch.device("meta"):
        expected = {n: tuple(t.shape) for n, t in HunyuanVideo15Transformer(model).state_dict().items()}
    missing, unexpected = sorted(set(expected) - set(stored)), sorted(set(stored) - set(expected))
    if missing or unexpected:
        raise UserInputError(
            f"{folder}: the weights do not match its config.json (missing {missing[:3]}, unexpected "
            f"{unexpected[:3]}); the folder is incomplete or not a HunyuanVideo-1.5 transformer"
        )
    for name, shape in expected.items():
        t = stored[name]
        if t.shape != shape:
            raise UserInputError(f"{t.file}: {name} has shape {t.shape}, config.json implies {shape}")
        if t.dtype not in ("F32", "BF16", "F16"):
            raise UserInputError(
                f"{t.file}: {name} is {t.dtype}; vidforge reads float32, bfloat16 or float16"
            )
    return list(expected)


def published_source(src: Path) -> tuple[Path, HunyuanVideo15Model, dict[str, StoredTensor], list[str]]:
    """A diffusers transformer (or pipeline) folder checked from its headers."""
    folder = transformer_folder(Path(src))
    if not (folder / CONFIG).is_file():
        raise UserInputError(f"{folder}: no config.json; point at a HunyuanVideo-1.5 diffusers folder")
    try:
        model = HunyuanVideo15Model(**model_fields(read_json(folder / CONFIG), folder / CONFIG))
    except ValidationError as err:
        raise UserInputError(f"{folder / CONFIG} cannot be represented: {err.errors()[0]['msg']}") from None
    stored = stored_tensors(folder, DIFFUSERS_SINGLE, DIFFUSERS_INDEX)
    return folder, model, stored, _checked(model, stored, folder)


def write_export(src: Path, out: Path, dtype: str | None = None) -> HunyuanVideo15Model:
    """Write the weights and config.json of a vidforge export of the published folder `src` into `out`;
    `dtype` None keeps every tensor's dtype, "float32" or "bfloat16" casts all of them."""
    if dtype not in CASTS:
        raise UserInputError(
            f"--dtype {dtype}: use float32 or bfloat16 (or leave it out to keep the weights')"
        )
    _, model, stored, names = published_source(src)
    out = Path(out)
    output_folder(out)
    with ExitStack() as files:
        write_safetensors(out / WEIGHTS, lazy_entries(names, stored, files, CASTS[dtype]), {"format": FORMAT})
    write_config(out, model)
    return model


def import_weights(src: Path, out: Path, profile: Any, dtype: str | None = None) -> Path:
    """`vidforge model import`: the export of `src` (`write_export`) with profile.yaml, `profile` with its
    model section the imported one (the profile's attention kernels kept)."""
    model = write_export(src, out, dtype)
    data = profile.model_dump(mode="json")
    kept = {name: getattr(profile.model, name) for name in ("attention", "sdpa_backend")}
    data["model"] = {**model.model_dump(mode="json"), **kept}
    resolved = validate_profile(data, f"{transformer_folder(Path(src)) / CONFIG} in the profile")
    write_config(Path(out), resolved.model)
    write_text(Path(out) / "profile.yaml", dump_profile(resolved))
    return Path(out)


def read_export(export: Path) -> HunyuanVideo15Model:
    path = Path(export) / CONFIG
    data = read_json(path) if path.is_file() else {}
    if data.get("format") != FORMAT or not isinstance(data.get("model"), dict):
        raise UserInputError(f"{path}: not a vidforge export's config; point at a vidforge export folder")
    try:
        return HunyuanVideo15Model.model_validate(data["model"])
    except ValidationError as err:
        raise UserInputError(f"{path}: not a hunyuan15 model ({err.errors()[0]['msg']})") from None


def export_weights(export: Path, out: Path, max_shard_bytes: int = 5 * 2**30) -> Path:
    """Write the vidforge export at `export` as a diffusers HunyuanVideo15Transformer3DModel folder:
    config.json and diffusion_pytorch_model.safetensors, or shards of at most `max_shard_bytes` with their
    index (diffusers' names)."""
    export = Path(export)
    model = read_export(export)
    stored = stored_tensors(export, WEIGHTS, f"{WEIGHTS}.index.json")
    names = _checked(model, stored, export)
    config = published_config(model, metadata.version("diffusers"))
    return write_diffusers_folder(out, names, stored, config, max_shard_bytes)


def load_published(
    src: Path, device: torch.device | str = "cpu", dtype: torch.dtype | None = None, runtime: Any = None
):
    """The network of a published folder without importing it first: built on the meta device, each tensor
    read, moved (and cast to `dtype` if given) and assigned, so the weights exist once. `runtime`: a model
    section whose attention settings (`RUNTIME_FIELDS`) the network runs with."""
    _, model, stored, names = published_source(src)
    if runtime is not None:
        model = with_runtime(model, runtime)
    with torch.device("meta"):
        network = HunyuanVideo15Transformer(model)
    state = {}
    with ExitStack() as files:
        for entry in lazy_entries(names, stored, files, None):
            tensor = entry.load().to(device)
            state[entry.name] = tensor.to(dtype) if dtype is not None else tensor
    network.load_state_dict(state, strict=True, assign=True)
    return network
