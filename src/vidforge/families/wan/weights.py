"""Wan2.1 weights between diffusers' folder layout and vidforge's export, one tensor at a time.

Import: a diffusers `WanTransformer3DModel` folder (config.json and diffusion_pytorch_model.safetensors,
or shards with their .index.json; float32, bfloat16 or float16), or a whole Wan pipeline folder (its
transformer/), becomes a vidforge export (model.safetensors, config.json, profile.yaml: what
`vidforge infer` and fine-tuning read). Export: the reverse, a folder that
`WanTransformer3DModel.from_pretrained` loads with no missing or unexpected keys. The wan family's
parameter names are diffusers' own (`vidforge.families.wan.network`), so both directions copy tensors by name,
bytes untouched (an import may cast to one dtype on request): import then export gives every tensor
back bitwise. Neither ever holds more than one tensor of the model in memory.

Anything wrong with the input raises `UserInputError` naming the file and what to do.
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

from vidforge.errors import UserInputError
from vidforge.families import wan
from vidforge.files import output_folder, write_text
from vidforge.models.presets import build_model
from vidforge.profile import RunProfile, dump_profile
from vidforge.profile.loading import validate_profile
from vidforge.profile.model import RUNTIME_FIELDS, Model, with_runtime
from vidforge.weights.checkpoint import CONFIG, FORMAT, WEIGHTS, read_config, write_config
from vidforge.weights.safetensors_stream import (
    DIFFUSERS_INDEX,
    DIFFUSERS_SINGLE,
    StoredTensor,
    lazy_entries,
    stored_tensors,
    write_diffusers_folder,
    write_safetensors,
)
from vidforge.weights.weights_check import check_config_against_weights

FLOAT_DTYPES = ("F32", "BF16", "F16")
# Keys diffusers itself ignores when loading a Wan transformer (`_keys_to_ignore_on_load_unexpected`).
IGNORED = ("norm_added_q",)
ROPE_MAX_SEQ_LEN = 1024  # diffusers' table length; vidforge computes RoPE per position (no limit)


# --- configs ----------------------------------------------------------------------------------------


def pipeline_parts(src: str | os.PathLike) -> dict[str, Path]:
    """The component folders of a whole diffusers Wan pipeline folder (model_index.json beside
    transformer/, vae/, text_encoder/, tokenizer/, scheduler/), by name; empty for anything else."""
    return wan.pipeline_parts(Path(src))


def transformer_folder(src: str | os.PathLike) -> Path:
    """The transformer folder of `src`: src itself, or src/transformer for a whole diffusers pipeline."""
    path = Path(src)
    if not path.is_dir():
        raise UserInputError(f"{path}: not a folder; point at a diffusers Wan transformer folder")
    return wan.transformer_folder(path)


def model_from_diffusers(config: dict[str, Any], where: Path) -> Model:
    """The wan family's `model` section for a diffusers WanTransformer3DModel config."""
    fields = wan.model_fields(config, where)
    # Validated as a profile's model section, so a shape vidforge cannot build is refused in its words.
    return validate_profile({"model": fields}, f"{where} cannot be represented").model


def diffusers_config(model: Model) -> dict[str, Any]:
    """diffusers' config.json of the wan `model` section."""
    if model.family != "wan":
        raise UserInputError(
            f"model.family is {model.family!r}: only the wan family exports to diffusers' WanTransformer3DModel"
        )
    if model.rope_theta != 10000.0:
        raise UserInputError(
            f"model.rope_theta={model.rope_theta}: diffusers' Wan fixes RoPE's base at 10000; export a model "
            "trained with it"
        )
    try:
        version = metadata.version("diffusers")
    except metadata.PackageNotFoundError:
        version = "0.33.0"
    return {
        "_class_name": wan.CLASS_NAME,
        "_diffusers_version": version,
        "patch_size": list(model.patch),
        "num_attention_heads": model.heads,
        "attention_head_dim": model.head_dim,
        "in_channels": model.in_channels,
        "out_channels": model.in_channels,
        "text_dim": model.text_dim,
        "ffn_dim": model.mlp_hidden,
        "num_layers": model.layers,
        "cross_attn_norm": model.cross_attn_norm,
        "qk_norm": "rms_norm_across_heads",
        "rope_max_seq_len": ROPE_MAX_SEQ_LEN,
        **wan.FIXED_CONFIG,
        **wan.diffusers_image_config(model),
    }


def _check_against(model: Model, stored: dict[str, StoredTensor], folder: Path) -> list[str]:
    """The stored tensors' names in the model's order, after checking names, shapes and dtypes."""
    # held to the headers before the model is built: a config of 20000 layers beside weights for 2 is
    # refused at once, not after building 20000 layers
    expected = check_config_against_weights(model, stored, folder / CONFIG, IGNORED)
    for name in expected:
        t = stored[name]
        if t.dtype not in FLOAT_DTYPES:
            raise UserInputError(
                f"{t.file}: {name} is {t.dtype}; vidforge reads float32, bfloat16 or float16 weights "
                "(dequantise the checkpoint first)"
            )
    return list(expected)


# --- import and export ------------------------------------------------------------------------------


def _diffusers_source(src: str | os.PathLike) -> tuple[Path, Model, dict[str, StoredTensor], list[str]]:
    """A diffusers Wan transformer folder checked from its headers: the folder, its model section, its
    stored tensors and their names in the model's order."""
    folder = transformer_folder(src)
    if not (folder / CONFIG).is_file():
        raise UserInputError(f"{folder}: no config.json; point at a diffusers Wan transformer folder")
    model = model_from_diffusers(wan.read_json(folder / CONFIG), folder / CONFIG)
    stored = stored_tensors(folder, DIFFUSERS_SINGLE, DIFFUSERS_INDEX)
    return folder, model, stored, _check_against(model, stored, folder)


def import_wan(
    src: str | os.PathLike, out: str | os.PathLike, profile: RunProfile, dtype: str | None = None
) -> Path:
    """Write the vidforge export of the diffusers Wan transformer at `src` into `out`: model.safetensors,
    config.json, and profile.yaml (`profile` with its `model` section replaced by the imported one).
    `dtype`: None keeps every tensor's dtype; "float32" or "bfloat16" casts all of them."""
    cast = {None: None, "float32": "F32", "bfloat16": "BF16"}.get(dtype, "?")
    if cast == "?":
        raise UserInputError(
            f"--dtype {dtype}: use float32 or bfloat16 (or leave it out to keep the weights')"
        )
    folder, model, stored, names = _diffusers_source(src)
    data = profile.model_dump(mode="json")
    # The imported shape with the profile's choice of attention kernels and sparsity, and what the
    # pipeline's model_index.json says, not the transformer's config: expand_timesteps, a second expert.
    kept = {
        name: getattr(profile.model, name)
        for name in (*RUNTIME_FIELDS, "expand_timesteps", "experts", "boundary_ratio")
    }
    data["model"] = {**model.model_dump(mode="json"), **kept}
    resolved = validate_profile(data, f"{folder / CONFIG} in the profile")
    out = output_folder(out)
    with ExitStack() as files:
        write_safetensors(out / WEIGHTS, lazy_entries(names, stored, files, cast), {"format": FORMAT})
    write_config(out, resolved.model)
    write_text(out / "profile.yaml", dump_profile(resolved))
    return out


def load_diffusers_wan(
    src: str | os.PathLike,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    runtime: Model | None = None,
) -> torch.nn.Module:
    """The wan model of a diffusers transformer (or pipeline) folder, without importing it first: built
    on the meta device, each tensor read, moved (and cast to `dtype` if given) and assigned, so the
    weights exist once. `runtime`: a model section whose attention kernel and sparsity
    (`RUNTIME_FIELDS`) the network runs with."""
    _, model_cfg, stored, names = _diffusers_source(src)
    if runtime is not None:
        model_cfg = with_runtime(model_cfg, runtime)
    model = build_model(model_cfg, device="meta")
    state = {}
    with ExitStack() as files:
        for entry in lazy_entries(names, stored, files, None):
            tensor = entry.load().to(device)
            state[entry.name] = tensor.to(dtype) if dtype is not None else tensor
    model.load_state_dict(state, strict=True, assign=True)
    return model


def export_wan(export: str | os.PathLike, out: str | os.PathLike, max_shard_bytes: int = 5 * 2**30) -> Path:
    """Write the vidforge export at `export` (a wan model) as a diffusers WanTransformer3DModel folder:
    config.json and diffusion_pytorch_model.safetensors, or shards of at most `max_shard_bytes` with
    their index (diffusers' names). A run folder's export is found by the caller
    (`weights_folder.export_published`)."""
    export = Path(export)
    try:
        model = read_config(export)
    except (ValueError, ValidationError) as err:
        raise UserInputError(f"{err}; point at a vidforge export folder") from None  # err names the file
    config = diffusers_config(model)
    stored = stored_tensors(export, WEIGHTS, f"{WEIGHTS}.index.json")
    names = _check_against(model, stored, export)
    return write_diffusers_folder(out, names, stored, config, max_shard_bytes)
