"""A tiny random Wan2.1-I2V diffusers pipeline folder, as the download lays it out: saved by
`WanImageToVideoPipeline.save_pretrained`, so model_index.json names every component and
`WanImageToVideoPipeline.from_pretrained` loads it (transformer/ with the image path, vae/, text_encoder/
(umT5), tokenizer/, scheduler/, image_encoder/ (CLIP vision), image_processor/)."""

from __future__ import annotations

from pathlib import Path

import torch
from wan_fixtures import text_parts, tiny_transformer, tiny_vae

LATENT = 4  # the tiny VAE's channels
MASK = 4  # the first-frame mask's channels: the VAE's temporal compression
CLIP_WIDTH = 12  # the tiny CLIP's hidden size: the transformer's image_dim
CLIP_SIZE = 32  # its input resolution (patches of 8: 16 patch tokens and the class token)


def save_tiny_wan_i2v_pipeline(root: Path) -> Path:
    """Write the pipeline folder at `root` (4 latent channels, text width 16, 2 layers) and return it."""
    from diffusers import WanImageToVideoPipeline
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel

    torch.manual_seed(0)
    transformer = tiny_transformer(
        in_channels=LATENT + MASK + LATENT, out_channels=LATENT, image_dim=CLIP_WIDTH, added_kv_proj_dim=16
    )
    vae = tiny_vae()
    text = text_parts()
    clip = CLIPVisionConfig(
        hidden_size=CLIP_WIDTH, intermediate_size=24, num_hidden_layers=3, num_attention_heads=2,
        image_size=CLIP_SIZE, patch_size=8, projection_dim=8,
    )  # fmt: skip
    pipe = WanImageToVideoPipeline(
        transformer=transformer,
        vae=vae,
        image_processor=CLIPImageProcessor(size={"shortest_edge": CLIP_SIZE}, crop_size=CLIP_SIZE),
        image_encoder=CLIPVisionModel(clip).eval(),
        **text,
    )
    pipe.save_pretrained(root)
    return root
