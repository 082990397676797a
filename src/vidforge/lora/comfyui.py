"""`vidforge model export RUN --to comfyui`: a LoRA run's adapter as the file ComfyUI's LoraLoader loads.

ComfyUI maps a LoRA's keys to its model's weights by their names (`comfy/lora.py`,
`model_lora_keys_unet`: every weight `diffusion_model.X.weight` of the model answers to the key `X`'s
prefix `diffusion_model.X`), and reads each layer's pair as `X.lora_B.weight` (up) and `X.lora_A.weight`
(down) with the scale `X.alpha` / rank (`comfy/weight_adapter/lora.py`, `LoRAAdapter`). Its models carry
the names of each family's original release, not diffusers': the family's spec renames each layer
(`FamilySpec.comfyui_lora`). The tensors are the adapter's, unchanged; `alpha` is written per layer so
ComfyUI's strength 1 applies the adapter as trained (W + alpha / rank x B @ A, as `--merged` folds it)."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors import safe_open

from vidforge.errors import UserInputError
from vidforge.files import output_folder, write_bytes
from vidforge.lora import PREFIX, WEIGHTS, read_adapter, sorted_header

FILE = "lora_comfyui.safetensors"
PARTS = (".lora_A.weight", ".lora_B.weight")


def comfyui_tensors(record: dict) -> dict[str, torch.Tensor]:
    """The adapter folder's tensors (`read_adapter`'s record) under ComfyUI's keys, each layer's alpha
    beside its pair."""
    from vidforge.families import family, load

    spec = family(record["model"]["family"])
    if spec.comfyui_lora is None:
        raise UserInputError(
            f"--to comfyui: ComfyUI has no model of the {spec.name} family; export the adapter to diffusers "
            "(it already is one) or merge it (--merged)"
        )
    rename = load(spec.comfyui_lora)
    alpha = float(record["lora"]["alpha"])
    out: dict[str, torch.Tensor] = {}
    with safe_open(str(record["folder"] / WEIGHTS), framework="pt", device="cpu") as f:
        for key in sorted(f.keys()):
            part = next((p for p in PARTS if key.endswith(p)), None)
            if part is None or not key.startswith(f"{PREFIX}."):
                raise UserInputError(
                    f"{record['folder'] / WEIGHTS}: unexpected key {key}; export the run again"
                )
            layer = key[len(PREFIX) + 1 : -len(part)]
            theirs = rename(layer)
            if theirs is None:
                raise UserInputError(
                    f"--to comfyui: the adapter trains {layer}, which ComfyUI's {spec.name} model has no "
                    "layer for; train without it in train.lora.target_modules"
                )
            out[f"diffusion_model.{theirs}{part}"] = f.get_tensor(key).contiguous()
            # a tensor per key: safetensors refuses tensors that share memory
            out[f"diffusion_model.{theirs}.alpha"] = torch.tensor(alpha)
    return out


def export_comfyui(adapter: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Write the LoRA run's (or its export folder's) adapter into `out` as ComfyUI's LoRA file, through
    the one writer; the file's path."""
    from safetensors.torch import save

    try:
        record = read_adapter(adapter)
    except UserInputError:
        raise UserInputError(
            f"--to comfyui: {adapter} holds no LoRA adapter; point at a LoRA training run (train.lora set) or "
            "its export folder (full weights: load them in ComfyUI as diffusers' folder, --to diffusers)"
        ) from None
    tensors = comfyui_tensors(record)
    folder = output_folder(Path(out))
    data = save(tensors, metadata={"format": "pt"})
    write_bytes(folder / FILE, sorted_header(data))
    return folder / FILE
