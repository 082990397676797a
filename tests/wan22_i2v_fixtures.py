"""A tiny random Wan2.2 I2V-A14B diffusers pipeline folder, as the download lays it out: two image-to-video
experts of one shape (transformer/: high noise, transformer_2/: low noise; in_channels = 4 predicted +
4 mask + 4 first-frame latent, no image embedding) and model_index.json's boundary_ratio, no image
encoder (Wan2.2 I2V reads no CLIP), saved by `WanImageToVideoPipeline.save_pretrained`, so
`WanImageToVideoPipeline.from_pretrained` loads it. The VAE, umT5 and tokenizer are `wan_fixtures`' tiny
Wan2.1 ones (Wan2.2 A14B ships Wan2.1's VAE)."""

from __future__ import annotations

from pathlib import Path

import torch
from wan_fixtures import text_parts, tiny_transformer, tiny_vae

LATENT = 4  # the tiny VAE's channels
MASK = 4  # the first-frame mask's channels: the VAE's temporal compression
BOUNDARY = 0.9  # Wan2.2-I2V-A14B's: with FLOW_SHIFT 3 and 4 UniPC steps, t = 1, 0.9 | 0.75, 0.5


def save_tiny_wan22_i2v_pipeline(root: Path, boundary: float = BOUNDARY) -> Path:
    """Write the two-expert image-to-video pipeline folder at `root` and return it."""
    from diffusers import WanImageToVideoPipeline

    torch.manual_seed(0)
    vae, text = tiny_vae(), text_parts()
    experts = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        experts.append(tiny_transformer(in_channels=LATENT + MASK + LATENT, out_channels=LATENT))
    pipe = WanImageToVideoPipeline(
        vae=vae, transformer=experts[0], transformer_2=experts[1], boundary_ratio=boundary, **text
    )
    pipe.save_pretrained(root)
    return root
