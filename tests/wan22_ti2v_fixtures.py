"""A tiny random Wan2.2 TI2V-5B diffusers pipeline folder, as the download lays it out: saved by
`WanPipeline(expand_timesteps=True).save_pretrained` (the published folder's class and flag), so
`WanPipeline` and `WanImageToVideoPipeline` load it. Its VAE is the Wan2.2 one in miniature:
`AutoencoderKLWan` with `is_residual`, pixels patchified 2x2 into 12 channels, 16x spatial and 4x temporal
compression; the transformer takes its latent channels (48 in the published model, 8 here)."""

from __future__ import annotations

from pathlib import Path

import torch
from wan_fixtures import text_parts, tiny_transformer

CHANNELS = 8  # the tiny VAE's z_dim and the transformer's in/out channels
FLOW_SHIFT = 5.0  # the Wan2.2-TI2V-5B-Diffusers scheduler's
LATENTS_MEAN = [0.1, -0.2, 0.05, 0.0, 0.3, -0.1, 0.2, -0.05]
LATENTS_STD = [1.5, 0.8, 2.0, 1.0, 0.7, 1.2, 0.9, 1.1]


def tiny_wan22_vae():
    """The Wan2.2 VAE's layout (is_residual, patch 2, 4x16x16) at toy widths."""
    from diffusers import AutoencoderKLWan

    return AutoencoderKLWan(
        base_dim=8, decoder_base_dim=12, z_dim=CHANNELS, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
        temperal_downsample=[False, True, True], is_residual=True, in_channels=12, out_channels=12,
        patch_size=2, scale_factor_spatial=16, scale_factor_temporal=4,
        latents_mean=LATENTS_MEAN, latents_std=LATENTS_STD,
    )  # fmt: skip


def save_tiny_ti2v_pipeline(root: Path) -> Path:
    """Write the pipeline folder at `root` (8 latent channels, text width 16, 2 layers) and return it."""
    from diffusers import WanPipeline

    torch.manual_seed(0)
    transformer = tiny_transformer(in_channels=CHANNELS, out_channels=CHANNELS)
    text = text_parts(FLOW_SHIFT)
    pipe = WanPipeline(transformer=transformer, vae=tiny_wan22_vae(), expand_timesteps=True, **text)
    pipe.save_pretrained(root)
    return root
