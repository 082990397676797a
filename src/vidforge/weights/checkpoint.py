"""Model checkpoints as a folder: `model.safetensors` (the weights) and `config.json` (the profile's
`model` section). Loading rebuilds the model from the config and reads tensors with safetensors;
nothing is ever unpickled. (Training state - optimizer, EMA, data position - is the training loop's
DCP checkpoint; this is the portable artefact that inference and fine-tuning start from.)"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from vidforge.files import atomic_path, output_folder, write_text
from vidforge.models.backbone import VideoTransformer
from vidforge.models.presets import build_model
from vidforge.profile.model import Model, with_runtime
from vidforge.weights.safetensors_stream import safetensors_shapes
from vidforge.weights.weights_check import check_config_against_weights

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
FORMAT = "vidforge-dit"  # every family's exports (DiT, ST-DiT, Wan); the name is in files already written


def save_model(model: VideoTransformer, directory: str | os.PathLike) -> Path:
    """Write the model's weights and config (any family's) into `directory` (created if needed) through
    `vidforge.files`: a killed save never leaves a half-written checkpoint, a planted link is not followed."""
    if not isinstance(getattr(model, "config", None), Model):
        raise ValueError(
            "save_model needs a model built by vidforge.models.build_model (it carries its config)"
        )
    out = output_folder(directory)
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in model.state_dict().items()}
    with atomic_path(out / WEIGHTS) as tmp:
        save_file(tensors, str(tmp), metadata={"format": FORMAT})
    write_config(out, model.config)
    return out


def write_config(directory: Path, config: Model) -> Path:
    """`config.json` of an export (written after its weights, under a temporary name and renamed)."""
    return _write_json(directory, {"format": FORMAT, "model": config.model_dump(mode="json")})


def config_notes(directory: str | os.PathLike) -> dict:
    """Everything an export's (or a LoRA adapter's) config.json holds, the notes beside `model` included."""
    return json.loads((Path(directory) / CONFIG).read_text())


def add_config_notes(directory: str | os.PathLike, **notes) -> None:
    """Add keys beside `model` to an export's (or adapter's) config.json: the training step, the expert a
    run trained and its pair (`read_config` ignores them)."""
    _write_json(Path(directory), config_notes(directory) | notes)


def _write_json(directory: Path, config: dict) -> Path:
    return write_text(directory / CONFIG, json.dumps(config, indent=2) + "\n")


def read_config(directory: str | os.PathLike) -> Model:
    path = Path(directory) / CONFIG
    if not path.is_file():
        raise ValueError(
            f"{path}: no model config; point at a folder written by vidforge.weights.checkpoint.save_model"
        )
    data = json.loads(path.read_text())
    if data.get("format") != FORMAT or "model" not in data:
        raise ValueError(
            f"{path}: not a vidforge model config (format {data.get('format')!r}, expected {FORMAT!r})"
        )
    return Model.model_validate(data["model"])


def load_model(
    directory: str | os.PathLike,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    runtime: Model | None = None,
) -> VideoTransformer:
    """Rebuild the model from `config.json` and load `model.safetensors` into it (every tensor must
    match, held to the file's header before the model is built: no missing or unexpected names, no shape
    changes). Built on the meta device first, so the weights are allocated once. `runtime`: a model
    section whose attention kernel and sparsity (`RUNTIME_FIELDS`) the network runs with instead of the
    config's."""
    directory = Path(directory)
    config = read_config(directory)
    if runtime is not None:
        config = with_runtime(config, runtime)
    weights = directory / WEIGHTS
    if not weights.is_file():
        raise ValueError(f"{weights}: missing; the folder has a config but no weights")
    # the config held to the weights' headers before anything is built (20000 layers beside 2 was
    # minutes of building), the names and shapes with it
    check_config_against_weights(config, safetensors_shapes(weights, "export it again"), directory / CONFIG)
    model = build_model(config, device="meta")
    state = {}
    with safe_open(str(weights), framework="pt", device=str(device)) as f:
        for name in f.keys():
            tensor = f.get_tensor(name)
            state[name] = tensor.to(dtype) if dtype is not None and tensor.is_floating_point() else tensor
    model.load_state_dict(state, strict=True, assign=True)
    return model
