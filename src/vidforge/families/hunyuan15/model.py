"""The hunyuan15 family's model section: HunyuanVideo-1.5's own fields beside what every family has, and
its published presets (torch-free: the profile's validator reads them). Field names are vidforge's where
the DiT has the same quantity (layers, hidden, heads, patch, in_channels, text_dim, image_dim,
condition_channels), so the shared forward (`VideoTransformer`) reads them as it reads any family's; the
rest are this family's own, each the diffusers config entry it mirrors.

The caption is one tensor (`text`, (N, L + text_2_tokens, text_dim)): the MLLM's (Qwen2.5-VL) hidden states
of the prompt, then `text_2_tokens` positions holding the glyph encoder's (ByT5) states in their first
`text_2_dim` features (zeros after), with one mask over both (`captions.join_caption`). The shared forward
takes one caption; this layout carries the pipeline's two encoders in it without a second argument."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from vidforge.families.model import FixedBlock, Model

FAMILY = "hunyuan15"
LATENT_CHANNELS = 32  # AutoencoderKLHunyuanVideo15's latent channels (the transformer's out_channels)
CONDITION_CHANNELS = LATENT_CHANNELS + 1  # the first frame's latents and its mask (in_channels 65)
# What the network refuses at its first forward, as settings every profile of the family carries (its
# presets' `profile_defaults` and a published folder's defaults), so that the rulebook's refusal at load
# (`layout_rules`) never meets a profile the family gave: packed rows (plain batches
# only so far), and caption dropout (HunyuanVideo-1.5's unconditional branch reads its encoded empty prompt).
PLAIN_BATCHES = {"data.packing": False, "diffusion.caption_dropout": 0}


class HunyuanVideo15Model(Model, FixedBlock):
    """HunyuanVideo15Transformer3DModel's config in vidforge's words (diffusers' entry in brackets); the
    defaults are the published shape."""

    expand_timesteps: ClassVar[bool] = False  # the first frame enters as condition channels instead
    cross_attn_norm: ClassVar[bool] = False  # no cross-attention: the caption is a stream of every block

    family: Literal["hunyuan15"] = FAMILY
    """HunyuanVideo-1.5 (T2V and I2V); `vidforge model import` brings its published weights in."""
    preset: str | None = None
    layers: int = Field(54, ge=1)
    """Double-stream blocks (num_layers)."""
    hidden: int = Field(2048, ge=1)
    """Model width (num_attention_heads x attention_head_dim)."""
    heads: int = Field(16, ge=1)
    """Attention heads (num_attention_heads)."""
    mlp_hidden: int = Field(8192, ge=1)
    """Inner width of both streams' feed-forwards (hidden x mlp_ratio)."""
    refiner_layers: int = Field(2, ge=0)
    """Blocks of the caption's token refiner (num_refiner_layers)."""
    patch: tuple[int, int, int] = (1, 1, 1)
    """(patch_size_t, patch_size, patch_size)."""
    in_channels: int = Field(LATENT_CHANNELS, ge=1)
    """Latent channels predicted (out_channels)."""
    condition_channels: int = Field(CONDITION_CHANNELS, ge=0)
    """Channels read beside the latents and not predicted (in_channels - out_channels): the image-to-video
    first frame's latents and its mask, zeros for text-to-video."""
    text_dim: int = Field(3584, ge=1)
    """The MLLM's hidden width (text_embed_dim)."""
    text_2_dim: int = Field(1472, ge=1)
    """The glyph encoder's hidden width (text_embed_2_dim)."""
    text_2_tokens: int = Field(256, ge=0)
    """Glyph-encoder positions at the end of every caption (the pipeline's ByT5 max length)."""
    image_dim: int = Field(1152, ge=1)
    """The image encoder's width (image_embed_dim: SigLIP's last hidden states)."""
    rope_axes: tuple[int, int, int] = (16, 56, 56)
    """Channels of each head rotated by t, h and w (rope_axes_dim)."""
    rope_theta: float = Field(256.0, gt=0)
    """Base of the rotary position embedding's frequencies (rope_theta)."""
    task: Literal["t2v", "i2v"] = "t2v"
    """What the published weights were trained for (task_type); the network is the same."""
    target_size: int = Field(640, ge=16)
    """The pixel size the pipeline's default resolution buckets are built around (480p: 640, 720p: 960)."""

    @model_validator(mode="after")
    def _check_hunyuan(self) -> HunyuanVideo15Model:
        if sum(self.rope_axes) != self.head_dim or any(a % 2 for a in self.rope_axes):
            raise ValueError(
                f"rope_axes: three even parts summing to the head size hidden/heads = {self.head_dim}, got "
                f"{list(self.rope_axes)}"
            )
        if self.attention_window is not None or self.attention_topk is not None:
            raise ValueError(
                "attention_window: sliding-tile and video sparse attention are not built for the hunyuan15 "
                "family's joint attention; drop attention_window and attention_topk"
            )
        if self.text_2_dim > self.text_dim:
            raise ValueError(
                f"text_2_dim: the glyph encoder's states ride in the caption's {self.text_dim} features, got "
                f"{self.text_2_dim}; raise text_dim or lower text_2_dim"
            )
        return self

    @property
    def samples_from_image(self) -> bool:
        """Text-to-video weights sample from zeros in the condition channels (the pipeline's), I2V from an image."""
        return self.task == "i2v"

    @property
    def multimodal_block(self) -> bool:
        """The caption is a second stream of every block, read in joint attention (no cross-attention)."""
        return True


# HunyuanVideo-1.5's published transformers (hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-{480p,720p}_
# {t2v,i2v}): one shape, 54 double-stream blocks of 16 heads of 128, feed-forward 4x, 2 refiner blocks, patch
# 1x1x1 over the VAE's 32 channels, Qwen2.5-VL-7B (3584) and Glyph-ByT5 (1472) captions, SigLIP (1152) images.
# The 480p and 720p weights differ in the resolution they were trained at (target_size), not in shape.
SHAPE: dict[str, object] = {
    "layers": 54, "hidden": 2048, "heads": 16, "mlp_hidden": 8192, "refiner_layers": 2, "patch": (1, 1, 1),
    "in_channels": LATENT_CHANNELS, "condition_channels": CONDITION_CHANNELS, "text_dim": 3584,
    "text_2_dim": 1472, "text_2_tokens": 256, "image_dim": 1152, "rope_axes": (16, 56, 56), "rope_theta": 256.0,
}  # fmt: skip
TARGET_SIZE = {"480p": 640, "720p": 960}  # the pipeline's target_size per published resolution
PRESETS: dict[str, dict[str, object]] = {
    f"hunyuanvideo1.5-{res}-{task}": {**SHAPE, "task": task, "target_size": size}
    for res, size in TARGET_SIZE.items()
    for task in ("t2v", "i2v")
}


def default_size(target_size: int, aspect: tuple[int, int] = (16, 9), patch: int = 16) -> tuple[int, int]:
    """(height, width) the pipeline samples at when given none (text-to-video: 16:9; image-to-video: the
    image's aspect, width:height): of its buckets (sizes in multiples of the VAE's
    `patch` pixels holding about (target_size / patch)^2 patches, aspect at most 4), the closest to
    `aspect` (width:height) among those no taller (no wider, for a tall aspect), as
    HunyuanVideo15ImageProcessor.calculate_default_height_width picks."""
    patches = round((target_size / patch) ** 2)
    buckets, rows, cols = [], patches, 1  # (height, width) in patches, from the tallest down
    while rows > 0:
        if max(rows, cols) / min(rows, cols) <= 4.0:
            buckets.append((rows * patch, cols * patch))
        if (cols + 1) * rows <= patches:
            cols += 1
        else:
            rows -= 1
    wanted = aspect[1] / aspect[0]
    ratios = [round(h / w, 5) for h, w in buckets]
    side = [i for i, r in enumerate(ratios) if (r - wanted <= 0 if wanted >= 1 else r - wanted >= 0)]
    return buckets[min(side, key=lambda i: abs(ratios[i] - wanted))]
