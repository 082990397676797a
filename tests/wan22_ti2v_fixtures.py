"""A tiny random Wan2.2 TI2V-5B diffusers pipeline folder, as the download lays it out: saved by
`WanPipeline(expand_timesteps=True).save_pretrained` (the published folder's class and flag), so
`WanPipeline` and `WanImageToVideoPipeline` load it. Its VAE is the Wan2.2 one in miniature:
`AutoencoderKLWan` with `is_residual`, pixels patchified 2x2 into 12 channels, 16x spatial and 4x temporal
compression; the transformer takes its latent channels (48 in the published model, 8 here)."""

from __future__ import annotations

from pathlib import Path

import torch
from wan_fixtures import VOCAB, tiny_tokenizer

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
    from diffusers import UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    torch.manual_seed(0)
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=CHANNELS,
        out_channels=CHANNELS, text_dim=16, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True,
        rope_max_seq_len=32,
    )  # fmt: skip
    config = UMT5Config(
        vocab_size=len(VOCAB), d_model=16, d_kv=8, d_ff=32, num_layers=2, num_heads=2,
        relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
    )  # fmt: skip
    scheduler = UniPCMultistepScheduler(
        prediction_type="flow_prediction",
        use_flow_sigmas=True,
        flow_shift=FLOW_SHIFT,
        num_train_timesteps=1000,
    )
    pipe = WanPipeline(
        tokenizer=tiny_tokenizer(),
        text_encoder=UMT5EncoderModel(config).eval(),
        vae=tiny_wan22_vae(),
        scheduler=scheduler,
        transformer=transformer,
        expand_timesteps=True,
    )
    pipe.save_pretrained(root)
    return root
