"""A tiny random Wan2.1 T2V diffusers pipeline folder, as the download lays it out: saved by
`WanPipeline.save_pretrained`, so model_index.json names every component and
`WanPipeline.from_pretrained` loads it (transformer/, vae/, text_encoder/ (umT5), tokenizer/, scheduler/)."""

from __future__ import annotations

from pathlib import Path

import torch

WORDS = ["a", "red", "square", "moving", "right", "left", "blue", "circle", "the", "on"]
VOCAB = {tok: i for i, tok in enumerate(["<pad>", "</s>", "<unk>", *WORDS])}
FLOW_SHIFT = 3.0  # the Wan2.1-T2V-*-Diffusers scheduler's


def tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab=VOCAB, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )


def save_tiny_wan_pipeline(root: Path) -> Path:
    """Write the pipeline folder at `root` (4 latent channels, text width 16, 2 layers) and return it."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    torch.manual_seed(0)
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4,
        text_dim=16, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True, rope_max_seq_len=32,
    )  # fmt: skip
    vae = AutoencoderKLWan(
        base_dim=8, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1, temperal_downsample=[False, True, True],
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
    pipe = WanPipeline(
        tokenizer=tiny_tokenizer(),
        text_encoder=UMT5EncoderModel(config).eval(),
        vae=vae,
        scheduler=scheduler,
        transformer=transformer,
    )
    pipe.save_pretrained(root)
    return root
