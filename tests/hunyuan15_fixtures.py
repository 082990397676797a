"""Tiny HunyuanVideo-1.5 parts built with diffusers' and transformers' own classes and random weights:
the transformer (every parameter moved off its initialisation, norms included) and its inputs, in both
the reference's argument layout and vidforge's."""

from __future__ import annotations

import torch
from diffusers import HunyuanVideo15Transformer3DModel

from vidforge.families.hunyuan15.captions import join_caption
from vidforge.families.hunyuan15.model import HunyuanVideo15Model

LATENT = 4  # latent channels (out_channels); in_channels = 2 * LATENT + 1
TINY = {
    "in_channels": 2 * LATENT + 1,
    "out_channels": LATENT,
    "num_attention_heads": 2,
    "attention_head_dim": 16,
    "num_layers": 2,
    "num_refiner_layers": 1,
    "mlp_ratio": 2.5,
    "patch_size": 2,
    "patch_size_t": 1,
    "text_embed_dim": 24,
    "text_embed_2_dim": 12,
    "image_embed_dim": 20,
    "rope_axes_dim": (4, 6, 6),
    "rope_theta": 256.0,
    "target_size": 64,
}
GLYPHS = 5  # glyph (ByT5) positions at the end of the caption
IMAGE_TOKENS = 9


def reference_transformer(task: str = "t2v", seed: int = 0, **overrides) -> HunyuanVideo15Transformer3DModel:
    """diffusers' transformer in float64, every parameter perturbed (so loading by name is checked)."""
    torch.manual_seed(seed)
    ref = HunyuanVideo15Transformer3DModel(**{**TINY, "task_type": task, **overrides}).double()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return ref.eval()


def our_config(ref: HunyuanVideo15Transformer3DModel, **overrides) -> HunyuanVideo15Model:
    """The family's `model` section of the reference's config, spelled out (the reader is tested apart)."""
    c = ref.config
    return HunyuanVideo15Model(
        layers=c.num_layers,
        hidden=c.num_attention_heads * c.attention_head_dim,
        heads=c.num_attention_heads,
        mlp_hidden=int(c.num_attention_heads * c.attention_head_dim * c.mlp_ratio),
        refiner_layers=c.num_refiner_layers,
        patch=(c.patch_size_t, c.patch_size, c.patch_size),
        in_channels=c.out_channels,
        condition_channels=c.in_channels - c.out_channels,
        text_dim=c.text_embed_dim,
        text_2_dim=c.text_embed_2_dim,
        text_2_tokens=GLYPHS,
        image_dim=c.image_embed_dim,
        rope_axes=tuple(c.rope_axes_dim),
        rope_theta=c.rope_theta,
        task=c.task_type,
        target_size=c.target_size,
        **overrides,
    )


def inputs(batch=2, shape=(3, 4, 6), length=7, image=False, seed=2, dtype=torch.float64, glyphs=GLYPHS):
    """Random inputs: latents, condition latents, flow time, both captions with padding (sample 1's shorter;
    sample 0 has glyph text, sample 1 none, as a prompt without quotes), and an image embedding."""
    g = torch.Generator().manual_seed(seed)

    def draw(*size):
        return torch.randn(*size, generator=g, dtype=torch.float64).to(dtype)

    mllm_mask = torch.ones(batch, length, dtype=torch.bool)
    mllm_mask[1:, length - 3 :] = False
    glyph_mask = torch.zeros(batch, glyphs, dtype=torch.bool)
    glyph_mask[0, :3] = True
    return {
        "x": draw(batch, LATENT, *shape),
        "condition": draw(batch, LATENT + 1, *shape) if image else None,
        "t": torch.rand(batch, generator=g, dtype=torch.float64).to(dtype),
        "mllm": draw(batch, length, TINY["text_embed_dim"]),
        "mllm_mask": mllm_mask,
        "glyph": draw(batch, glyphs, TINY["text_embed_2_dim"]),
        "glyph_mask": glyph_mask,
        "image": draw(batch, IMAGE_TOKENS, TINY["image_embed_dim"]) if image else None,
    }


def reference_out(ref: HunyuanVideo15Transformer3DModel, inp: dict) -> torch.Tensor:
    """The reference's forward as its pipelines call it: [latents, condition] channels, timestep 1000 t,
    an all-zero image embedding for text-to-video."""
    x = inp["x"]
    condition = (
        inp["condition"]
        if inp["condition"] is not None
        else x.new_zeros(x.shape[0], LATENT + 1, *x.shape[2:])
    )
    image = inp["image"]
    if image is None:
        image = x.new_zeros(x.shape[0], IMAGE_TOKENS, TINY["image_embed_dim"])
    with torch.no_grad():
        return ref(
            torch.cat([x, condition], dim=1),
            inp["t"] * 1000,
            inp["mllm"],
            inp["mllm_mask"].long(),
            encoder_hidden_states_2=inp["glyph"],
            encoder_attention_mask_2=inp["glyph_mask"].long(),
            image_embeds=image,
            return_dict=False,
        )[0]


def caption(inp: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """vidforge's one caption of the inputs' two encoders' states (the family's `join_caption`)."""
    return join_caption(inp["mllm"], inp["mllm_mask"], inp["glyph"], inp["glyph_mask"])


# --- a whole pipeline folder in the published layout ----------------------------------------------

FLOW_SHIFT = 5.0  # the scheduler's shift (the published 480p folders')
GUIDANCE = 6.0  # the guider's guidance_scale
SCALING = 1.03682  # AutoencoderKLHunyuanVideo15's scaling_factor
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tiny_mllm_tokenizer():
    """A byte-level BPE tokenizer with Qwen2's special tokens and chat template (no merges: one token a byte)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import Qwen2TokenizerFast

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok.add_special_tokens(specials)
    return Qwen2TokenizerFast(
        tokenizer_object=tok,
        pad_token="<|endoftext|>",
        eos_token="<|im_end|>",
        unk_token=None,
        chat_template=CHAT_TEMPLATE,
    )


def pipeline_parts(task: str = "t2v", seed: int = 0) -> dict:
    """Every component of HunyuanVideo15Pipeline (and the image-to-video one's image encoder) at toy
    widths matching `TINY`: the VAE (16x spatial, 4x temporal, LATENT channels), Qwen2.5-VL's text model,
    ByT5 (a T5 encoder over bytes) with its tokenizer, the flow scheduler and the CFG guider."""
    from diffusers import AutoencoderKLHunyuanVideo15, ClassifierFreeGuidance, FlowMatchEulerDiscreteScheduler
    from transformers import (
        ByT5Tokenizer,
        Qwen2_5_VLTextConfig,
        Qwen2_5_VLTextModel,
        T5Config,
        T5EncoderModel,
    )

    torch.manual_seed(seed)
    mllm_tokenizer = tiny_mllm_tokenizer()
    mllm = Qwen2_5_VLTextConfig(
        vocab_size=len(mllm_tokenizer), hidden_size=TINY["text_embed_dim"], intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048,
        rope_scaling={"type": "mrope", "mrope_section": [2, 2, 2]},
    )  # fmt: skip
    glyph_tokenizer = ByT5Tokenizer()
    glyph = T5Config(
        vocab_size=len(glyph_tokenizer), d_model=TINY["text_embed_2_dim"], d_kv=6, d_ff=24, num_layers=1,
        num_heads=2, relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=1,
        decoder_start_token_id=0,
    )  # fmt: skip
    parts = {
        "transformer": reference_transformer(task, seed).float(),
        "vae": AutoencoderKLHunyuanVideo15(
            latent_channels=LATENT,
            block_out_channels=(8, 8, 16, 16, 16),
            layers_per_block=1,
            scaling_factor=SCALING,
        ),  # fmt: skip
        "text_encoder": Qwen2_5_VLTextModel(mllm).eval(),
        "tokenizer": mllm_tokenizer,
        "text_encoder_2": T5EncoderModel(glyph).eval(),
        "tokenizer_2": glyph_tokenizer,
        "scheduler": FlowMatchEulerDiscreteScheduler(shift=FLOW_SHIFT),
        "guider": ClassifierFreeGuidance(guidance_scale=GUIDANCE),
    }
    if task == "i2v":
        from transformers import SiglipImageProcessor, SiglipVisionConfig, SiglipVisionModel

        vision = SiglipVisionConfig(
            hidden_size=TINY["image_embed_dim"], intermediate_size=32, num_hidden_layers=1,
            num_attention_heads=2, image_size=24, patch_size=8,
        )  # fmt: skip
        parts["image_encoder"] = SiglipVisionModel(vision).eval()
        parts["feature_extractor"] = SiglipImageProcessor(size={"height": 24, "width": 24})
    return parts


def save_tiny_pipeline(root, task: str = "t2v"):
    """Write HunyuanVideo15Pipeline's (task t2v) or HunyuanVideo15ImageToVideoPipeline's (i2v) folder at
    `root` by its own save_pretrained (so model_index.json names every component) and return it."""
    from diffusers import HunyuanVideo15ImageToVideoPipeline, HunyuanVideo15Pipeline

    cls = HunyuanVideo15ImageToVideoPipeline if task == "i2v" else HunyuanVideo15Pipeline
    cls(**pipeline_parts(task)).save_pretrained(root)
    return root
