"""A tiny random LTX-2 pipeline folder saved by diffusers' LTX2Pipeline.save_pretrained (every component by
its own save_pretrained, model_index.json naming each, LTX2Pipeline.from_pretrained loads it): the published
layout at toy widths, with the published VAE compression and scheduler."""

from __future__ import annotations

import torch
from wan_fixtures import tiny_tokenizer

CAPTION_CHANNELS = 16  # the tiny Gemma's hidden size
GEMMA_LAYERS = 2
# The published LTX-2 scheduler's config: exponential time shift, mu between base_shift and max_shift by
# the token count, the last sigma stretched to shift_terminal.
SCHEDULER = {
    "use_dynamic_shifting": True, "base_shift": 0.95, "max_shift": 2.05, "base_image_seq_len": 1024,
    "max_image_seq_len": 4096, "shift_terminal": 0.1, "time_shift_type": "exponential",
}  # fmt: skip


def tiny_text_encoder():
    """Gemma 3 (a text model of 2 layers of width 16, a 2-layer SigLIP) as the pipeline's text encoder."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    config = Gemma3Config(
        text_config={
            "vocab_size": 16, "hidden_size": CAPTION_CHANNELS, "intermediate_size": 32,
            "num_hidden_layers": GEMMA_LAYERS, "num_attention_heads": 2, "num_key_value_heads": 1,
            "head_dim": 8, "max_position_embeddings": 64, "sliding_window": 16,
        },
        vision_config={
            "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
            "image_size": 28, "patch_size": 14,
        },
        mm_tokens_per_image=4,
    )  # fmt: skip
    return Gemma3ForConditionalGeneration(config)


def save_tiny_pipeline(out, audio_to_video: bool = True):
    """The tiny pipeline saved at `out`; its VAE's per-channel latent statistics random (the pipeline
    normalises with them). `audio_to_video=False`: the audio-to-video cross-attention's output projection
    zeroed, so that the joint model's video output is the video path's (diffusers' isolate_modalities),
    which is what the pipeline's default sampling can then be held to."""
    from diffusers import (
        AutoencoderKLLTX2Audio,
        AutoencoderKLLTX2Video,
        FlowMatchEulerDiscreteScheduler,
        LTX2Pipeline,
        LTX2VideoTransformer3DModel,
    )
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

    torch.manual_seed(0)
    pipe = LTX2Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER),
        vae=AutoencoderKLLTX2Video(  # the published compression (32 x 32 x 8) at toy widths
            latent_channels=4, block_out_channels=(8, 8, 8), decoder_block_out_channels=(8, 8, 8),
            layers_per_block=(1, 1, 1, 1), decoder_layers_per_block=(1, 1, 1, 1),
            spatio_temporal_scaling=(True, True, True), decoder_spatio_temporal_scaling=(True, True, True),
            decoder_inject_noise=(False,) * 4, downsample_type=("spatiotemporal",) * 3,
            upsample_type=("spatiotemporal",) * 3, upsample_residual=(False,) * 3, upsample_factor=(1, 1, 1),
            patch_size=4, patch_size_t=1, decoder_causal=False,
        ),
        audio_vae=AutoencoderKLLTX2Audio(
            base_channels=4, output_channels=2, ch_mult=(1,), num_res_blocks=1, attn_resolutions=None,
            in_channels=2, resolution=32, latent_channels=2, norm_type="pixel", causality_axis="height",
            dropout=0.0, mid_block_add_attention=False, sample_rate=16000, mel_hop_length=160, is_causal=True,
            mel_bins=8,
        ),
        text_encoder=tiny_text_encoder(),
        tokenizer=tiny_tokenizer(),
        connectors=LTX2TextConnectors(
            caption_channels=CAPTION_CHANNELS, text_proj_in_factor=GEMMA_LAYERS + 1,
            video_connector_num_attention_heads=2, video_connector_attention_head_dim=8,
            video_connector_num_layers=1, video_connector_num_learnable_registers=None,
            audio_connector_num_attention_heads=2, audio_connector_attention_head_dim=8,
            audio_connector_num_layers=1, audio_connector_num_learnable_registers=None,
            connector_rope_base_seq_len=32, rope_type="split",
        ),
        transformer=LTX2VideoTransformer3DModel(
            in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, cross_attention_dim=16,
            caption_channels=CAPTION_CHANNELS, audio_in_channels=4, audio_out_channels=4,
            audio_num_attention_heads=2, audio_attention_head_dim=4, audio_cross_attention_dim=8, num_layers=2,
            rope_type="split", base_height=256, base_width=384,
        ),
        vocoder=LTX2Vocoder(
            in_channels=16, hidden_channels=32, out_channels=2, upsample_kernel_sizes=[4, 4],
            upsample_factors=[2, 2], resnet_kernel_sizes=[3], resnet_dilations=[[1, 3, 5]],
            output_sampling_rate=16000,
        ),
    )  # fmt: skip
    with torch.no_grad():
        pipe.vae.latents_mean.copy_(torch.randn(4) * 0.3)
        pipe.vae.latents_std.copy_(torch.rand(4) + 0.5)
        if not audio_to_video:
            for block in pipe.transformer.transformer_blocks:
                block.audio_to_video_attn.to_out[0].weight.zero_()
                block.audio_to_video_attn.to_out[0].bias.zero_()
    pipe.save_pretrained(out, safe_serialization=True)
    return out
