"""LoRA with peft (`train.lora`): adapters injected into a built model, their export in the format
diffusers loads, and loading them back (scaled) or merged into the base.

`build` calls `apply_lora` after `--init` loaded the base and before any parallelism, so the training
loop, the step, FSDP and the checkpoints see a model whose only trainable parameters are the adapters.
The base is frozen in the compute dtype (bf16 halves its memory; no gradient or optimizer state exists
for it); the adapters stay fp32, as full fine-tuning's master weights do.

The exported adapter is diffusers' LoRA file: `pytorch_lora_weights.safetensors` with peft's keys under
the `transformer.` prefix (`transformer.blocks.0.attn1.to_q.lora_A.weight`) and the LoraConfig in its
`lora_adapter_metadata`, which `WanTransformer3DModel.load_lora_adapter(folder, prefix="transformer")` and
`WanPipeline.load_lora_weights(folder)` read. Beside it, `config.json` (format `vidforge-lora`: the model
section, the adapter's settings, the step, the base it was trained on) and `profile.yaml`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

from vidforge.errors import UserInputError
from vidforge.files import output_folder, weights_places, write_bytes, write_text
from vidforge.profile.model import Model
from vidforge.profile.train import Lora

WEIGHTS = "pytorch_lora_weights.safetensors"  # diffusers' LORA_WEIGHT_NAME_SAFE
CONFIG = "config.json"
FORMAT = "vidforge-lora"
PREFIX = "transformer"  # the pipeline component the adapter belongs to, as diffusers prefixes its keys
ADAPTER = "default"  # peft's adapter name inside vidforge's modules


def default_targets(family: str) -> tuple[str, ...]:
    """The family's LoRA targets when train.lora.target_modules is empty (`FamilySpec.lora_targets`)."""
    from vidforge.families import family as spec

    return spec(family).lora_targets


def lora_config(cfg: Lora, family: str):
    from peft import LoraConfig

    targets = cfg.target_modules or default_targets(family)
    return LoraConfig(
        r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=list(targets)
    )


def apply_lora(model: nn.Module, cfg: Lora, base_dtype: torch.dtype) -> str:
    """Freeze `model` in `base_dtype` and inject fp32 LoRA adapters (peft) into its target modules, in
    place; a note saying how many weights train."""
    from peft import inject_adapter_in_model

    config = lora_config(cfg, model.config.family)
    model.requires_grad_(False)
    for param in model.parameters():  # parameters only: buffers (rotary tables) keep their precision
        param.data = param.data.to(base_dtype)
    try:
        inject_adapter_in_model(config, model, adapter_name=ADAPTER)
    except ValueError as err:  # peft: "Target modules {...} not found in the base model"
        raise UserInputError(
            f"train.lora.target_modules: {err}; name linear layers of the {model.config.family} model"
        ) from None
    from peft.tuners.tuners_utils import BaseTunerLayer

    for module in model.modules():
        if isinstance(module, BaseTunerLayer):
            module.cast_input_dtype_enabled = CAST_OUTSIDE_AUTOCAST
    trainable = 0
    for name, param in model.named_parameters():
        if is_adapter(name):
            param.data = param.data.float()
            param.requires_grad_(True)
            trainable += param.numel()
    total = sum(p.numel() for p in model.parameters())
    return (
        f"LoRA rank {cfg.rank} on {', '.join(config.target_modules)}: {trainable:,} of {total:,} "
        f"weights train; the rest frozen in {str(base_dtype).removeprefix('torch.')}"
    )


class _OutsideAutocast:
    """peft's `cast_input_dtype_enabled` flag, true only outside autocast. Under autocast peft would cast
    each adapter's bf16 input to the adapter's float32 and autocast would cast it straight back: the same
    values, but a new tensor that every adapter keeps for its backward (q, k and v three copies of one
    input, 8 x hidden bytes a token more in a Wan block). Autocast casts the adapter's weight instead.
    Outside autocast (validation sampling of a bf16 base with fp32 adapters) the cast makes the dtypes
    agree."""

    def __bool__(self) -> bool:
        return not (torch.is_autocast_enabled("cuda") or torch.is_autocast_enabled("cpu"))


CAST_OUTSIDE_AUTOCAST = _OutsideAutocast()


def is_adapter(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def adapter_tensors(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapters of a LoRA model's (clean-named) weights, under diffusers' keys:
    `blocks.0.attn1.to_q.lora_A.default.weight` -> `transformer.blocks.0.attn1.to_q.lora_A.weight`."""
    return {
        f"{PREFIX}.{name.replace(f'.{ADAPTER}.', '.')}": t.float().contiguous()
        for name, t in weights.items()
        if is_adapter(name)
    }


def sorted_header(data: bytes) -> bytes:
    """A safetensors file with its JSON header's keys in sorted order. safetensors writes `__metadata__`
    from a Rust HashMap, in an order that changes from run to run: two identical runs exported files that
    differed in their first bytes. Offsets are relative to the data after the header, so only the header
    changes (padded with spaces to 8 bytes, as safetensors pads it)."""
    n = int.from_bytes(data[:8], "little")
    header = json.dumps(json.loads(data[8 : 8 + n]), sort_keys=True, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    return len(header).to_bytes(8, "little") + header + data[8 + n :]


def save_adapter(
    out: Path, weights: dict[str, torch.Tensor], model: Model, cfg: Lora, step: int, base: str | None
) -> Path:
    """Write the adapters among `weights` (a LoRA model's clean-named tensors) as diffusers' LoRA file
    and vidforge's config.json into `out`, through the one writer (`vidforge.files`)."""
    from safetensors.torch import save

    output_folder(out)
    config = lora_config(cfg, model.family).to_dict()
    config = {k: sorted(v) if isinstance(v, set) else v for k, v in config.items()}
    metadata = {f"{PREFIX}.{k}": v for k, v in config.items() if _jsonable(v)}
    data = save(
        adapter_tensors(weights),
        metadata={"format": "pt", "lora_adapter_metadata": json.dumps(metadata, sort_keys=True)},
    )
    write_bytes(out / WEIGHTS, sorted_header(data))
    record = {
        "format": FORMAT,
        "model": model.model_dump(mode="json"),
        "lora": cfg.model_dump(mode="json"),
        "step": step,
        "base": base,
    }
    write_text(out / CONFIG, json.dumps(record, indent=2) + "\n")
    return out


def diffusers_loading(pipeline: str, folder: str | None) -> str:
    """The call that loads the adapter in `folder` into diffusers' pipeline class `pipeline`: its
    `load_lora_weights`, or for a pipeline without one (HunyuanVideo-1.5's) its transformer's
    `load_lora_adapter`, which `load_lora_weights` runs for the others."""
    import diffusers

    if hasattr(getattr(diffusers, pipeline, None), "load_lora_weights") or not hasattr(diffusers, pipeline):
        return f".load_lora_weights({folder!r})"
    return f".transformer.load_lora_adapter({folder!r}, weight_name={WEIGHTS!r}, prefix={PREFIX!r})"


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except TypeError:
        return False
    return True


def is_adapter_folder(path: str | os.PathLike) -> bool:
    return (Path(path) / WEIGHTS).is_file() and (Path(path) / CONFIG).is_file()


def find_adapter(path: str | os.PathLike) -> Path | None:
    """The adapter folder `path` names (`files.weights_places`), or None."""
    return next((place for place in weights_places(path) if is_adapter_folder(place)), None)


def read_adapter(path: str | os.PathLike) -> dict[str, Any]:
    """The adapter folder's config.json (model, lora, step, base), or a UserInputError."""
    for candidate in weights_places(path):
        if is_adapter_folder(candidate):
            record = json.loads((candidate / CONFIG).read_text())
            if record.get("format") == FORMAT:
                return {**record, "folder": candidate}
    looked = ", ".join(str(place) for place in weights_places(path))
    raise UserInputError(
        f"--lora {path}: no {WEIGHTS} with a vidforge-lora {CONFIG} in {looked}; point at a LoRA training "
        "or fine-tune run (train.lora set) or its export folder"
    )


def load_adapter(model: nn.Module, path: str | os.PathLike, scale: float = 1.0) -> nn.Module:
    """Inject the adapter folder's LoRA (its LoraConfig and weights) into `model` in place, its output
    multiplied by `scale` (0: the base alone, 1: as trained)."""
    from peft import inject_adapter_in_model

    record = read_adapter(path)
    if Model.model_validate(record["model"]).patch_dim != model.config.patch_dim or (
        record["model"]["hidden"] != model.config.hidden
    ):
        raise UserInputError(
            f"--lora {path}: trained on a {record['model']['family']} model of hidden size "
            f"{record['model']['hidden']}, the base has {model.config.hidden}; pass the base it was trained on"
        )
    cfg = Lora.model_validate(record["lora"])
    inject_adapter_in_model(lora_config(cfg, model.config.family), model, adapter_name=ADAPTER)
    state = {}
    with safe_open(str(record["folder"] / WEIGHTS), framework="pt", device="cpu") as f:
        for key in f.keys():
            name = key.removeprefix(f"{PREFIX}.").replace(".lora_A.", f".lora_A.{ADAPTER}.")
            state[name.replace(".lora_B.", f".lora_B.{ADAPTER}.")] = f.get_tensor(key)
    expected = {name for name, _ in model.named_parameters() if is_adapter(name)}
    if set(state) != expected:
        raise UserInputError(
            f"--lora {path}: its adapters do not match the base's layers (missing "
            f"{sorted(expected - set(state))[:3]}, unexpected {sorted(set(state) - expected)[:3]})"
        )
    device = next(model.parameters()).device
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name in state:
                param.copy_(state[name].to(device))
    set_scale(model, scale)
    return model


def set_scale(model: nn.Module, scale: float) -> None:
    from peft.tuners.lora import LoraLayer

    for module in model.modules():
        if isinstance(module, LoraLayer):
            module.set_scale(ADAPTER, scale)


def merge(model: nn.Module) -> nn.Module:
    """Fold every adapter into its base weight (W + scale * B @ A) and put the plain layers back, in
    place: the model's state dict is the base's names again."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    for name, module in list(model.named_modules()):
        if isinstance(module, BaseTunerLayer):
            module.merge(adapter_names=[ADAPTER])
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child, module.get_base_layer())
    return model
