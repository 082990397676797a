"""A tiny random Wan2.1 T2V pipeline folder as the diffusers download lays it out (model_index.json,
transformer/, vae/, text_encoder/ (umT5), tokenizer/), saved with save_pretrained, so every test reads it
through the real loaders."""

from __future__ import annotations

import json
from pathlib import Path

import torch

WORDS = ["a", "red", "square", "moving", "right", "left", "blue", "circle", "the", "on"]
VOCAB = {tok: i for i, tok in enumerate(["<pad>", "</s>", "<unk>", *WORDS])}
TEXT_LEN = 8
# What diffusers' WanPipeline.from_pretrained reads to build each component.
MODEL_INDEX = {
    "_class_name": "WanPipeline",
    "scheduler": ["diffusers", "UniPCMultistepScheduler"],
    "text_encoder": ["transformers", "UMT5EncoderModel"],
    "tokenizer": ["transformers", "PreTrainedTokenizerFast"],
    "transformer": ["diffusers", "WanTransformer3DModel"],
    "vae": ["diffusers", "AutoencoderKLWan"],
}


def _tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab=VOCAB, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    ).save_pretrained(folder)


def write_tiny_wan_pipeline(root: Path) -> Path:
    """The pipeline folder at `root`, whole (WanPipeline.from_pretrained loads it; a UniPC scheduler): a 2-layer transformer (hidden 16, patch 1x2x2, 4 latent channels), a
    Wan VAE of base width 8 (8x spatial, 4x temporal compression), a 2-layer umT5 of width 16."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    root.mkdir(parents=True, exist_ok=True)
    (root / "model_index.json").write_text(json.dumps(MODEL_INDEX))
    UniPCMultistepScheduler(
        prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0
    ).save_pretrained(root / "scheduler")
    torch.manual_seed(0)
    WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4,
        text_dim=16, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True, rope_max_seq_len=32,
    ).save_pretrained(root / "transformer")  # fmt: skip
    AutoencoderKLWan(
        base_dim=8, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1, temperal_downsample=[False, True, True],
        latents_mean=[0.1, 0.2, -0.1, 0.0], latents_std=[1.5, 2.0, 0.5, 1.0],
    ).save_pretrained(root / "vae")  # fmt: skip
    config = UMT5Config(
        vocab_size=len(VOCAB), d_model=16, d_kv=8, d_ff=32, num_layers=2, num_heads=2,
        relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
    )  # fmt: skip
    UMT5EncoderModel(config).eval().save_pretrained(root / "text_encoder")
    _tokenizer(root / "tokenizer")
    return root
