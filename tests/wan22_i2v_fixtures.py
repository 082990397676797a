"""A tiny random Wan2.2 I2V-A14B diffusers pipeline folder, as the download lays it out: two image-to-video
experts of one shape (transformer/: high noise, transformer_2/: low noise; in_channels = 4 predicted +
4 mask + 4 first-frame latent, no image embedding) and model_index.json's boundary_ratio, no image
encoder (Wan2.2 I2V reads no CLIP), saved by `WanImageToVideoPipeline.save_pretrained`, so
`WanImageToVideoPipeline.from_pretrained` loads it. The VAE, umT5 and tokenizer are `wan_fixtures`' tiny
Wan2.1 ones (Wan2.2 A14B ships Wan2.1's VAE)."""

from __future__ import annotations

from pathlib import Path

import torch
from wan_fixtures import FLOW_SHIFT, VOCAB, tiny_tokenizer

LATENT = 4  # the tiny VAE's channels
MASK = 4  # the first-frame mask's channels: the VAE's temporal compression
BOUNDARY = 0.9  # Wan2.2-I2V-A14B's: with FLOW_SHIFT 3 and 4 UniPC steps, t = 1, 0.9 | 0.75, 0.5


def tiny_i2v_transformer(seed: int):
    """One expert: the tiny Wan2.1 transformer's shape reading the mask and first-frame latent too."""
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=LATENT + MASK + LATENT,
        out_channels=LATENT, text_dim=16, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True,
        rope_max_seq_len=32,
    )  # fmt: skip


def save_tiny_wan22_i2v_pipeline(root: Path, boundary: float = BOUNDARY) -> Path:
    """Write the two-expert image-to-video pipeline folder at `root` and return it."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanImageToVideoPipeline
    from transformers import UMT5Config, UMT5EncoderModel

    torch.manual_seed(0)
    vae = AutoencoderKLWan(
        base_dim=8, z_dim=LATENT, dim_mult=[1, 2, 2, 2], num_res_blocks=1, temperal_downsample=[False, True, True],
        latents_mean=[0.1, 0.2, -0.1, 0.0], latents_std=[1.5, 2.0, 0.5, 1.0],
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
    pipe = WanImageToVideoPipeline(
        tokenizer=tiny_tokenizer(),
        text_encoder=UMT5EncoderModel(config).eval(),
        vae=vae,
        scheduler=scheduler,
        transformer=tiny_i2v_transformer(1),
        transformer_2=tiny_i2v_transformer(2),
        boundary_ratio=boundary,
    )
    pipe.save_pretrained(root)
    return root
