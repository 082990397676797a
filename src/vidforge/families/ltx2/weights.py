"""LTX-2 weights between diffusers' folder layout and vidforge's export, one tensor at a time.

The network's parameter names are diffusers' own (`network`), so import (a diffusers transformer or
pipeline folder -> model.safetensors and config.json) and export (the reverse, a folder
`LTX2VideoTransformer3DModel.from_pretrained` loads with no missing or unexpected keys) copy tensors by name
with their bytes untouched (an import may cast on request): import then export gives every tensor back
bitwise. The published transformer is joint audio-video and the video path reads only its video part
(`network.video_state`); the audio stream's tensors ride along untouched in their own file beside the
network's (`AUDIO_WEIGHTS`: model.safetensors holds the network's state and nothing else, as every
family's export), and the diffusers config entries vidforge's `model` section does not hold (the audio stream's shape) are kept in
config.json beside it (`diffusers`), so that export writes the published transformer back whole. An
export without them (a LoRA merged into its base, `vidforge model export --merged`, a full fine-tune) takes
both from the base its config.json records, or that base's base. The
video path's names and shapes are checked against the network built on the meta device first."""

from __future__ import annotations

import json
from contextlib import ExitStack
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

from vidforge.errors import UserInputError
from vidforge.families.ltx2.model import LTX2Model
from vidforge.families.ltx2.network import LTX2Transformer
from vidforge.families.ltx2.published import (
    CLASS_NAME,
    CONFIG,
    is_audio,
    model_fields,
    read_json,
    transformer_folder,
)
from vidforge.families.model import Model
from vidforge.files import output_folder, write_text
from vidforge.profile import dump_profile
from vidforge.profile.loading import validate_profile
from vidforge.profile.model import with_runtime
from vidforge.weights.checkpoint import FORMAT, WEIGHTS
from vidforge.weights.safetensors_stream import (
    DIFFUSERS_INDEX,
    DIFFUSERS_SINGLE,
    StoredTensor,
    lazy_entries,
    safetensors_shapes,
    stored_tensors,
    write_diffusers_folder,
    write_safetensors,
)

CASTS = {None: None, "float32": "F32", "bfloat16": "BF16"}
DIFFUSERS = "diffusers"  # config.json's key for the published config entries beside `model`
AUDIO_WEIGHTS = "audio_stream.safetensors"  # an export's audio-stream tensors, beside model.safetensors


def diffusers_config(model: LTX2Model, published: dict[str, Any]) -> dict[str, Any]:
    """diffusers' config.json of the family's `model` section over the published entries it does not hold
    (the inverse of `published.model_fields`)."""
    return {
        **published,
        "_class_name": CLASS_NAME,
        "in_channels": model.in_channels,
        "out_channels": model.in_channels,
        "num_attention_heads": model.heads,
        "attention_head_dim": model.head_dim,
        "cross_attention_dim": model.hidden,
        "num_layers": model.layers,
        **({"caption_channels": model.text_dim} if model.caption_projection else {}),
        "rope_theta": model.rope_theta,
        "rope_type": model.rope_type,
        "rope_double_precision": model.rope_double_precision,
        "pos_embed_max_pos": int(model.rope_base[0]),
        "base_height": int(model.rope_base[1]),
        "base_width": int(model.rope_base[2]),
        "vae_scale_factors": list(model.vae_scale),
        "causal_offset": model.causal_offset,
        "gated_attn": model.gated_attention,
        "cross_attn_mod": model.prompt_modulation,
        "use_prompt_adaln_single": model.prompt_modulation_per_step,
        "use_prompt_embeddings": model.caption_projection,
        "ff_bias": model.ff_bias,
        "norm_eps": model.eps,
        "perturbed_attn": model.perturbed_attention,
    }


def _checked(model: LTX2Model, stored: dict[str, StoredTensor], folder: Path) -> list[str]:
    """The tensor names to copy: the network's in its order, then the audio stream's, after checking the
    stored video names, shapes and dtypes against the network."""
    with torch.device("meta"):
        expected = {n: tuple(t.shape) for n, t in LTX2Transformer(model).state_dict().items()}
    video = {name for name in stored if not is_audio(name)}
    missing, unexpected = sorted(set(expected) - video), sorted(video - set(expected))
    if missing or unexpected:
        raise UserInputError(
            f"{folder}: the weights do not match its config.json (missing {missing[:3]}, unexpected "
            f"{unexpected[:3]}); the folder is incomplete or not an LTX-2 transformer"
        )
    for name, shape in expected.items():
        t = stored[name]
        if t.shape != shape:
            raise UserInputError(f"{t.file}: {name} has shape {t.shape}, config.json implies {shape}")
    for name, t in stored.items():
        if t.dtype not in ("F32", "BF16", "F16"):
            raise UserInputError(
                f"{t.file}: {name} is {t.dtype}; vidforge reads float32, bfloat16 or float16"
            )
    return list(expected) + sorted(set(stored) - video)


def _model(fields: dict[str, Any], where: Path) -> LTX2Model:
    try:
        return LTX2Model(**fields)
    except ValidationError as err:
        raise UserInputError(f"{where} cannot be represented: {err.errors()[0]['msg']}") from None


def published_source(src: Path) -> tuple[Path, dict[str, Any], LTX2Model, dict[str, StoredTensor], list[str]]:
    """A diffusers transformer (or pipeline) folder checked from its headers: its folder, config, model
    section, stored tensors and the names to copy (the network's, then the audio stream's)."""
    folder = transformer_folder(Path(src))
    if not (folder / CONFIG).is_file():
        raise UserInputError(f"{folder}: no config.json; point at an LTX-2 diffusers folder")
    published = read_json(folder / CONFIG)
    model = _model(model_fields(published, folder / CONFIG), folder / CONFIG)
    stored = stored_tensors(folder, DIFFUSERS_SINGLE, DIFFUSERS_INDEX)
    return folder, published, model, stored, _checked(model, stored, folder)


def write_export(src: Path, out: Path, dtype: str | None = None, model: LTX2Model | None = None) -> LTX2Model:
    """Write the weights and config.json of a vidforge export of the published folder `src` into `out`;
    `dtype` None keeps every tensor's dtype, "float32" or "bfloat16" casts all of them. `model`: the
    section config.json states (the folder's own, with a profile's attention settings), else the folder's."""
    if dtype not in CASTS:
        raise UserInputError(
            f"--dtype {dtype}: use float32 or bfloat16 (or leave it out to keep the weights')"
        )
    _, published, found, stored, names = published_source(src)
    model = found if model is None else model
    video = [name for name in names if not is_audio(name)]
    audio = names[len(video) :]
    out = output_folder(out)
    with ExitStack() as files:
        write_safetensors(out / WEIGHTS, lazy_entries(video, stored, files, CASTS[dtype]), {"format": FORMAT})
        if audio:
            write_safetensors(
                out / AUDIO_WEIGHTS, lazy_entries(audio, stored, files, CASTS[dtype]), {"format": "pt"}
            )
    kept = {k: v for k, v in published.items() if not k.startswith("_")}
    config = {"format": FORMAT, "model": model.model_dump(mode="json"), DIFFUSERS: kept}
    write_text(out / CONFIG, json.dumps(config, indent=2) + "\n")
    return model


def import_weights(src: Path, out: Path, profile: Any, dtype: str | None = None) -> Path:
    """`vidforge model import`: the export of `src` (`write_export`) with profile.yaml, `profile` with its
    model section the imported one (the profile's attention kernels kept)."""
    _, _, model, _, _ = published_source(src)
    data = profile.model_dump(mode="json")
    kept = {name: getattr(profile.model, name) for name in ("attention", "sdpa_backend")}
    data["model"] = {**model.model_dump(mode="json"), **kept}
    resolved = validate_profile(data, f"{transformer_folder(Path(src)) / CONFIG} in the profile")
    write_export(src, out, dtype, resolved.model)
    write_text(Path(out) / "profile.yaml", dump_profile(resolved))
    return Path(out)


def _published_parts(
    export: Path, data: dict[str, Any], seen: frozenset[Path] = frozenset()
) -> tuple[dict[str, Any], dict[str, StoredTensor]]:
    """(the published config entries, the audio stream's stored tensors) an export is written back with:
    an import's own (beside its weights), else those of the base its config.json records (`base`: a LoRA
    merged into it, `vidforge model export --merged`, or a full fine-tune's --init), followed down the
    chain of vidforge exports (a fine-tune of a fine-tune) to an import or a published folder."""
    if DIFFUSERS in data:
        audio = export / AUDIO_WEIGHTS
        if not audio.is_file():
            return data[DIFFUSERS], {}
        return data[DIFFUSERS], safetensors_shapes(audio, "import the folder again")
    if not data.get("base"):
        raise UserInputError(
            f"{export / CONFIG}: not a vidforge import of an LTX-2 folder nor weights that record their base "
            "(the published transformer's audio stream and config entries come from it); export an imported "
            "folder or a LoRA run with --merged"
        )
    base = Path(data["base"])
    if base.resolve() in seen:
        raise UserInputError(
            f"{export / CONFIG}: its chain of bases loops back to {base}; record the published folder or its import as base"
        )
    config = read_json(base / CONFIG) if (base / CONFIG).is_file() else {}
    if config.get("format") == FORMAT:
        return _published_parts(base, config, seen | {base.resolve()})
    _, published, _, stored, names = published_source(base)
    kept = {k: v for k, v in published.items() if not k.startswith("_")}
    return kept, {name: stored[name] for name in names if is_audio(name)}


def export_weights(export: Path, out: Path, max_shard_bytes: int = 5 * 2**30) -> Path:
    """Write the vidforge export at `export` as a diffusers LTX2VideoTransformer3DModel folder: config.json
    and diffusion_pytorch_model.safetensors, or shards of at most `max_shard_bytes` with their index
    (diffusers' names), every tensor's bytes as stored, the audio stream's beside the video path's."""
    export = Path(export)
    data = read_json(export / CONFIG) if (export / CONFIG).is_file() else {}
    if data.get("format") != FORMAT or not isinstance(data.get("model"), dict):
        raise UserInputError(f"{export / CONFIG}: not a vidforge export's config; point at a vidforge export")
    model = _model(data["model"], export / CONFIG)
    published, audio = _published_parts(export, data)
    stored = stored_tensors(export, WEIGHTS, f"{WEIGHTS}.index.json") | audio
    names = _checked(model, stored, export)
    config = {**diffusers_config(model, published), "_diffusers_version": metadata.version("diffusers")}
    return write_diffusers_folder(out, names, stored, config, max_shard_bytes)


def load_published(
    src: Path,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    runtime: Model | None = None,
) -> LTX2Transformer:
    """The network of a published folder without importing it first: built on the meta device, each video
    tensor read, moved (and cast to `dtype` if given) and assigned, so the weights exist once; with
    `runtime`'s attention settings (`RUNTIME_FIELDS`) if given."""
    _, _, model, stored, names = published_source(src)
    if runtime is not None:
        model = with_runtime(model, runtime)
    with torch.device("meta"):
        network = LTX2Transformer(model)
    state = {}
    with ExitStack() as files:
        for entry in lazy_entries([n for n in names if not is_audio(n)], stored, files, None):
            tensor = entry.load().to(device)
            state[entry.name] = tensor.to(dtype) if dtype is not None else tensor
    network.load_state_dict(state, strict=True, assign=True)
    return network
