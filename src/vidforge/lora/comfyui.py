"""`vidforge model export RUN --to comfyui`: a LoRA run's adapter as the file ComfyUI's LoraLoader loads.

ComfyUI maps a LoRA's keys to its model's weights by their names (`comfy/lora.py`,
`model_lora_keys_unet`: every weight `diffusion_model.X.weight` of the model answers to the key `X`'s
prefix `diffusion_model.X`), and reads each layer's pair as `X.lora_B.weight` (up) and `X.lora_A.weight`
(down) with the scale `X.alpha` / rank, the rank being the down matrix's rows (`comfy/weight_adapter/
lora.py`, `LoRAAdapter`). Its models carry the names of each family's original release, not diffusers':
the family's spec renames each layer (`FamilySpec.comfyui_lora`), to a name or to a `Slot` where ComfyUI's
layer is not vidforge's one for one. The tensors are the adapter's; `alpha` is written per layer so
ComfyUI's strength 1 applies the adapter as trained (W + alpha / rank x B @ A, as `--merged` folds it)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from vidforge.errors import UserInputError
from vidforge.files import output_folder, write_bytes
from vidforge.lora import PREFIX, WEIGHTS, read_adapter, sorted_header

FILE = "lora_comfyui.safetensors"
PARTS = (".lora_A.weight", ".lora_B.weight")


@dataclass(frozen=True)
class Slot:
    """Where one of vidforge's layers lands in ComfyUI's model when not one for one: ComfyUI's layer
    `name`; `part` of `parts` equal blocks of its output rows where ComfyUI fuses several of vidforge's
    layers into one (the release's q, k and v as one qkv projection: parts 0, 1, 2 of 3); `swap_halves`
    where ComfyUI's layer gives the two halves of its output in the other order (the release's (shift,
    scale) where diffusers' gives (scale, shift))."""

    name: str
    part: int = 0
    parts: int = 1
    swap_halves: bool = False


def fused_pair(
    slots: list[tuple[Slot, torch.Tensor, torch.Tensor]], alpha: float
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """One LoRA pair (down, up, alpha) for a ComfyUI layer from the (slot, A, B) of each of vidforge's
    layers in it. Parts stack: down is the As one above the other, up puts each B in its part's rows and
    its own A's columns (block diagonal, zeros elsewhere), so up @ down is each B @ A in its part's rows;
    the rank is then the sum of theirs, so alpha grows with it and alpha / rank stays the adapter's."""
    slots = sorted(slots, key=lambda s: s[0].part)
    down = torch.cat([a for _, a, _ in slots])
    rows = slots[0][2].shape[0]
    up = slots[0][2].new_zeros(rows * slots[0][0].parts, down.shape[0])
    column = 0
    for slot, a, b in slots:
        if slot.swap_halves:
            b = torch.cat(b.chunk(2)[::-1])
        up[slot.part * rows : (slot.part + 1) * rows, column : column + a.shape[0]] = b
        column += a.shape[0]
    return down, up, alpha * len(slots)


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
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    with safe_open(str(record["folder"] / WEIGHTS), framework="pt", device="cpu") as f:
        for key in sorted(f.keys()):
            part = next((p for p in PARTS if key.endswith(p)), None)
            if part is None or not key.startswith(f"{PREFIX}."):
                raise UserInputError(
                    f"{record['folder'] / WEIGHTS}: unexpected key {key}; export the run again"
                )
            pairs.setdefault(key[len(PREFIX) + 1 : -len(part)], {})[part] = f.get_tensor(key)
    layers: dict[str, list[tuple[Slot, torch.Tensor, torch.Tensor]]] = {}
    for layer, pair in pairs.items():
        theirs = rename(layer)
        if theirs is None:
            raise UserInputError(
                f"--to comfyui: the adapter trains {layer}, which ComfyUI's {spec.name} model has no "
                "layer for; train without it in train.lora.target_modules"
            )
        slot = Slot(theirs) if isinstance(theirs, str) else theirs
        layers.setdefault(slot.name, []).append((slot, pair[PARTS[0]], pair[PARTS[1]]))
    alpha = float(record["lora"]["alpha"])
    out: dict[str, torch.Tensor] = {}
    for name, slots in layers.items():
        down, up, scale_alpha = fused_pair(slots, alpha)
        # a tensor per key: safetensors refuses tensors that share memory
        out[f"diffusion_model.{name}.lora_A.weight"] = down.contiguous()
        out[f"diffusion_model.{name}.lora_B.weight"] = up.contiguous()
        out[f"diffusion_model.{name}.alpha"] = torch.tensor(scale_alpha)
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
