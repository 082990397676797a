"""Wan2.2 A14B in the wan family: two WanTransformer3DModel experts of one shape, switched by the flow time
(diffusers' WanPipeline with `transformer_2` and `boundary_ratio`: the high-noise `transformer` runs
while the timestep is >= boundary_ratio x 1000, the low-noise `transformer_2` below it, each under its
own guidance scale). A profile says so with `model.experts=2` and `model.boundary_ratio`; one run of
`vidforge train` trains one expert (`train.expert`) on its own range of t.

The published download is a whole pipeline folder: model_index.json (with `boundary_ratio`) beside
transformer/ (high noise), transformer_2/ (low noise), vae/ (Wan2.1's), text_encoder/ (umT5),
tokenizer/ and scheduler/. Wan2.2 I2V-A14B is the same pair as a `WanImageToVideoPipeline` download: each
expert reads the first frame's mask and latent beside the noisy latents (`model.condition_channels`, as
Wan2.1-I2V's), but no image embedding (no image_encoder/), and switches at its own boundary."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vidforge.errors import UserInputError

FOLDERS = {"high": "transformer", "low": "transformer_2"}
"""Each expert's component folder in a diffusers pipeline download (`weights.experts.EXPERTS`' names)."""
BOUNDARY_A14B = 0.875  # Wan2.2-T2V-A14B-Diffusers' model_index.json boundary_ratio
BOUNDARY_I2V_A14B = 0.9  # Wan2.2-I2V-A14B-Diffusers'
# Wan2.2-T2V-A14B's own config (sample_guide_scale = (3.0, 4.0): low noise, high noise)
GUIDANCE_HIGH, GUIDANCE_LOW = 4.0, 3.0
GUIDANCE_I2V = 3.5  # Wan2.2-I2V-A14B's (sample_guide_scale = (3.5, 3.5)), both experts

# Wan2.2's A14B experts: each Wan2.1-14B's shape (40 layers, width 5120, 40 heads of 128, ffn 13824, 16
# latent channels predicted, umT5's 4096-wide text, the cross-attention LayerNorm), 14.3e9 parameters
# each, one of them running at each step.
A14B: dict[str, Any] = {
    "architecture": "dit",
    "in_channels": 16,
    "text_dim": 4096,
    "cross_attn_norm": True,
    "layers": 40,
    "hidden": 5120,
    "heads": 40,
    "mlp_hidden": 13824,
    "experts": 2,
}

PRESETS: dict[str, dict[str, Any]] = {
    # Wan2.2-T2V-A14B-Diffusers' transformer/ and transformer_2/
    "wan2.2-t2v-a14b": {**A14B, "boundary_ratio": BOUNDARY_A14B},
    # Wan2.2-I2V-A14B-Diffusers': in_channels 36 = 16 predicted + 20 read (4 mask channels, the first
    # frame's 16-channel latent), image_dim null (no CLIP)
    "wan2.2-i2v-a14b": {**A14B, "condition_channels": 20, "boundary_ratio": BOUNDARY_I2V_A14B},
}


def boundary_of(src: Path, read_json: Callable[[Path], dict[str, Any]]) -> float | None:
    """The boundary_ratio of a two-expert download (its model_index.json names `transformer_2`, which
    holds a config); None for any other folder. `read_json`: the wan family's reader (`wan.read_json`)."""
    index = src / "model_index.json"
    if not index.is_file() or not (src / FOLDERS["low"] / "config.json").is_file():
        return None
    config = read_json(index)
    if config.get("transformer_2") in (None, [None, None]):
        return None
    boundary = config.get("boundary_ratio")
    if boundary is None:
        raise UserInputError(
            f"{index}: names transformer_2 but no boundary_ratio, so WanPipeline never runs it; add the "
            f"published boundary_ratio (Wan2.2 T2V-A14B: {BOUNDARY_A14B}, I2V-A14B: {BOUNDARY_I2V_A14B}) or "
            "point at a one-expert download"
        )
    return float(boundary)


def read_experts(src: Path, published: Any, read_json, model_fields) -> Any:
    """`published` (a Wan pipeline folder read as one network) as a two-expert model when its
    model_index.json names `transformer_2`: model.experts=2 and its boundary_ratio, and Wan2.2's two
    guidance scales (Wan2.2 I2V-A14B's, 3.5 for both, for an image-to-video pair). Both experts must have
    one shape (diffusers' pipeline runs them on one latent)."""
    boundary = boundary_of(src, read_json)
    if boundary is None:
        return published
    low_config = src / FOLDERS["low"] / "config.json"
    low = model_fields(read_json(low_config), low_config)
    if low != published.model:
        differ = sorted(k for k in low if low[k] != published.model.get(k))
        raise UserInputError(
            f"{low_config}: the low-noise expert's {', '.join(differ)} differ from transformer/'s; "
            "both experts of a Wan2.2 download have one shape"
        )
    model = {**published.model, "experts": 2, "boundary_ratio": boundary}
    high, low = (
        (GUIDANCE_I2V, GUIDANCE_I2V) if model.get("condition_channels") else (GUIDANCE_HIGH, GUIDANCE_LOW)
    )
    defaults = {**published.defaults, "diffusion.guidance": high, "diffusion.guidance_2": low}
    folders = {expert: src / folder for expert, folder in FOLDERS.items()}
    return dataclasses.replace(published, model=model, defaults=defaults, expert_folders=folders)
