"""ComfyUI's LoRA loading, restated from its source (ComfyUI is not on PyPI): which LoRA keys its loader maps
to a model's weights (`comfy/lora.py`, `model_lora_keys_unet`) and how it applies a pair (`comfy/
weight_adapter/lora.py`, `LoRAAdapter.load` and `calculate_weight`). The tests of `model export --to comfyui`
apply our file to a state dict under ComfyUI's names with these rules."""

from __future__ import annotations

import torch


def comfyui_key_map(state: dict[str, torch.Tensor]) -> dict[str, str]:
    """comfy/lora.py, model_lora_keys_unet: the generic format, every `diffusion_model.X.weight` answers
    to `diffusion_model.X` (and `lora_unet_X` with dots as underscores)."""
    key_map = {}
    for k in state:
        if k.startswith("diffusion_model.") and k.endswith(".weight"):
            key_map["lora_unet_" + k[len("diffusion_model.") : -len(".weight")].replace(".", "_")] = k
            key_map[k[: -len(".weight")]] = k
    return key_map


def comfyui_apply(state: dict[str, torch.Tensor], lora: dict[str, torch.Tensor]) -> tuple[dict, set]:
    """comfy/lora.py load_lora + comfy/weight_adapter/lora.py LoRAAdapter: for each mapped x, up =
    x.lora_B.weight, down = x.lora_A.weight, alpha = x.alpha; W += alpha / down.shape[0] * up @ down
    (both flattened past dim 1, reshaped to W). The state patched, and the LoRA keys it loaded."""
    patched, loaded = dict(state), set()
    for x, target in comfyui_key_map(state).items():
        up, down = f"{x}.lora_B.weight", f"{x}.lora_A.weight"
        if up not in lora:
            continue
        alpha = lora[f"{x}.alpha"].item() if f"{x}.alpha" in lora else None
        loaded |= {up, down} | ({f"{x}.alpha"} if alpha is not None else set())
        scale = alpha / lora[down].shape[0] if alpha is not None else 1.0
        diff = lora[up].flatten(1) @ lora[down].flatten(1)
        assert diff.numel() == patched[target].numel(), (
            f"{x}: {tuple(diff.shape)} for {tuple(patched[target].shape)}"
        )
        patched[target] = patched[target] + scale * diff.reshape(patched[target].shape)
    return patched, loaded


def trained_adapter_export(model, cfg, lora, base, tmp_path):
    """`model` (the base saved at `base`) with a LoRA `lora` whose every B moved off its zeros (a trained
    adapter), saved as a run's export and written by `vidforge model export RUN --to comfyui`: (the run,
    the ComfyUI file's tensors, the number of adapted layers)."""
    from safetensors.torch import load_file
    from typer.testing import CliRunner

    from vidforge.cli.app import app
    from vidforge.lora import apply_lora, save_adapter
    from vidforge.lora.comfyui import FILE

    apply_lora(model, lora, torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_" in name:
                p.copy_(torch.randn_like(p) * 0.1)
    adapters = sum(".lora_B." in n for n, _ in model.named_parameters())
    run = save_adapter(tmp_path / "run" / "export", model.state_dict(), cfg, lora, 1, str(base)).parent
    out = tmp_path / "comfyui"
    result = CliRunner().invoke(app, ["model", "export", str(run), "--to", "comfyui", "-o", str(out)])
    assert result.exit_code == 0, result.output
    return run, load_file(out / FILE), adapters
