"""Tiny HunyuanVideo-1.5 parts built with diffusers' and transformers' own classes and random weights:
the transformer (every parameter moved off its initialisation, norms included) and its inputs, in both
the reference's argument layout and vidforge's."""

from __future__ import annotations

import torch
from diffusers import HunyuanVideo15Transformer3DModel

from vidforge.families.hunyuan15.config import HunyuanVideo15Model

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


def inputs(batch=2, shape=(3, 4, 6), length=7, image=False, seed=2, dtype=torch.float64):
    """Random inputs: latents, condition latents, flow time, both captions with padding (sample 1's shorter;
    sample 0 has glyph text, sample 1 none, as a prompt without quotes), and an image embedding."""
    g = torch.Generator().manual_seed(seed)

    def draw(*size):
        return torch.randn(*size, generator=g, dtype=torch.float64).to(dtype)

    mllm_mask = torch.ones(batch, length, dtype=torch.bool)
    mllm_mask[1:, length - 3 :] = False
    glyph_mask = torch.zeros(batch, GLYPHS, dtype=torch.bool)
    glyph_mask[0, :3] = True
    return {
        "x": draw(batch, LATENT, *shape),
        "condition": draw(batch, LATENT + 1, *shape) if image else None,
        "t": torch.rand(batch, generator=g, dtype=torch.float64).to(dtype),
        "mllm": draw(batch, length, TINY["text_embed_dim"]),
        "mllm_mask": mllm_mask,
        "glyph": draw(batch, GLYPHS, TINY["text_embed_2_dim"]),
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


def caption(inp: dict, text_dim: int = TINY["text_embed_dim"]) -> tuple[torch.Tensor, torch.Tensor]:
    """vidforge's one caption: the MLLM's states, then the glyph encoder's padded to the MLLM's width."""
    glyph = torch.nn.functional.pad(inp["glyph"], (0, text_dim - inp["glyph"].shape[-1]))
    return torch.cat([inp["mllm"], glyph], dim=1), torch.cat([inp["mllm_mask"], inp["glyph_mask"]], dim=1)
