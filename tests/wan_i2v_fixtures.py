"""A tiny random Wan2.1-I2V diffusers pipeline folder, as the download lays it out: saved by
`WanImageToVideoPipeline.save_pretrained`, so model_index.json names every component and
`WanImageToVideoPipeline.from_pretrained` loads it (transformer/ with the image path, vae/, text_encoder/
(umT5), tokenizer/, scheduler/, image_encoder/ (CLIP vision), image_processor/)."""

from __future__ import annotations

from pathlib import Path

import torch
from wan_fixtures import FLOW_SHIFT, VOCAB, tiny_tokenizer

LATENT = 4  # the tiny VAE's channels
MASK = 4  # the first-frame mask's channels: the VAE's temporal compression
CLIP_WIDTH = 12  # the tiny CLIP's hidden size: the transformer's image_dim
CLIP_SIZE = 32  # its input resolution (patches of 8: 16 patch tokens and the class token)


def save_tiny_wan_i2v_pipeline(root: Path) -> Path:
    """Write the pipeline folder at `root` (4 latent channels, text width 16, 2 layers) and return it."""
    from diffusers import (
        AutoencoderKLWan,
        UniPCMultistepScheduler,
        WanImageToVideoPipeline,
        WanTransformer3DModel,
    )
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        CLIPVisionModel,
        UMT5Config,
        UMT5EncoderModel,
    )

    torch.manual_seed(0)
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=LATENT + MASK + LATENT,
        out_channels=LATENT, text_dim=16, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True,
        image_dim=CLIP_WIDTH, added_kv_proj_dim=16, rope_max_seq_len=32,
    )  # fmt: skip
    vae = AutoencoderKLWan(
        base_dim=8, z_dim=LATENT, dim_mult=[1, 2, 2, 2], num_res_blocks=1, temperal_downsample=[False, True, True],
        latents_mean=[0.1, 0.2, -0.1, 0.0], latents_std=[1.5, 2.0, 0.5, 1.0],
    )  # fmt: skip
    text = UMT5Config(
        vocab_size=len(VOCAB), d_model=16, d_kv=8, d_ff=32, num_layers=2, num_heads=2,
        relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
    )  # fmt: skip
    clip = CLIPVisionConfig(
        hidden_size=CLIP_WIDTH, intermediate_size=24, num_hidden_layers=3, num_attention_heads=2,
        image_size=CLIP_SIZE, patch_size=8, projection_dim=8,
    )  # fmt: skip
    processor = CLIPImageProcessor(size={"shortest_edge": CLIP_SIZE}, crop_size=CLIP_SIZE)
    scheduler = UniPCMultistepScheduler(
        prediction_type="flow_prediction",
        use_flow_sigmas=True,
        flow_shift=FLOW_SHIFT,
        num_train_timesteps=1000,
    )
    pipe = WanImageToVideoPipeline(
        tokenizer=tiny_tokenizer(),
        text_encoder=UMT5EncoderModel(text).eval(),
        vae=vae,
        scheduler=scheduler,
        image_processor=processor,
        image_encoder=CLIPVisionModel(clip).eval(),
        transformer=transformer,
    )
    pipe.save_pretrained(root)
    return root
