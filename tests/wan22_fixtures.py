"""A tiny random Wan2.2 T2V-A14B diffusers pipeline folder, as the download lays it out: two experts of one
shape (transformer/: high noise, transformer_2/: low noise) and model_index.json's boundary_ratio, saved
by `WanPipeline.save_pretrained`, so `WanPipeline.from_pretrained` loads it. The VAE, umT5 and tokenizer are
`wan_fixtures`' tiny Wan2.1 ones (Wan2.2 A14B ships Wan2.1's VAE)."""

from __future__ import annotations

from pathlib import Path

import torch
from wan_fixtures import text_parts, tiny_transformer, tiny_vae

BOUNDARY = 0.875  # Wan2.2-T2V-A14B's: with FLOW_SHIFT 3 and 4 UniPC steps, t = 1, 0.9 | 0.75, 0.5


def save_tiny_wan22_pipeline(root: Path, boundary: float = BOUNDARY) -> Path:
    """Write the two-expert pipeline folder at `root` (4 latent channels, text width 16, 2 layers an
    expert, each with its own random weights) and return it."""
    from diffusers import WanPipeline

    torch.manual_seed(0)
    vae, text = tiny_vae(), text_parts()
    experts = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        experts.append(tiny_transformer())
    pipe = WanPipeline(
        vae=vae, transformer=experts[0], transformer_2=experts[1], boundary_ratio=boundary, **text
    )
    pipe.save_pretrained(root)
    return root
