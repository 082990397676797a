"""LTX-2's shape as the profile's `model` section holds it (torch-free: the profile's validator reads it).
Field names are vidforge's where the DiT has the same quantity (layers, hidden, heads, patch, in_channels,
text_dim), so the shared forward (`VideoTransformer`) reads them as it reads the DiT's; the rest are this
family's own, each the diffusers `LTX2VideoTransformer3DModel` config entry it mirrors.

The video path only: the published network is joint audio-video, and its video stream reads the audio
stream only through the audio-to-video cross-attention; with that off (diffusers' `isolate_modalities=True`,
LTX-core's video-only model) the video output depends on the video latents, the caption and the time
alone, which is what this family computes (`audio` refuses True in one line). The caption is the text
connector's video output (`LTX2TextConnectors`' first result, caption_channels wide)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

FAMILY = "ltx2"
LATENT_CHANNELS = 128  # AutoencoderKLLTX2Video's latent channels (the transformer's in/out_channels)


class LTX2Model(BaseModel):
    """LTX2VideoTransformer3DModel's video path in vidforge's words (diffusers' entry in brackets)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    family: Literal["ltx2"] = FAMILY
    preset: str | None = None
    layers: int = Field(48, ge=1)
    """Transformer blocks (num_layers)."""
    hidden: int = Field(4096, ge=1)
    """Video width (num_attention_heads x attention_head_dim)."""
    heads: int = Field(32, ge=1)
    """Video attention heads (num_attention_heads)."""
    patch: tuple[int, int, int] = (1, 1, 1)
    """(patch_size_t, patch_size, patch_size): the published 1x1x1 only (the VAE compresses 8x32x32)."""
    in_channels: int = Field(LATENT_CHANNELS, ge=1)
    """Latent channels read and predicted (in_channels = out_channels)."""
    condition_channels: Literal[0] = 0
    image_dim: Literal[0] = 0
    text_dim: int = Field(3840, ge=1)
    """The text connector's output width (caption_channels)."""
    rope_theta: float = Field(10000.0, gt=0)
    rope_type: Literal["interleaved", "split"] = "interleaved"
    """How q and k channels pair up for RoPE (rope_type)."""
    rope_double_precision: bool = True
    """RoPE's frequency ladder computed in float64 before float32 (rope_double_precision)."""
    rope_base: tuple[float, float, float] = (20.0, 2048.0, 2048.0)
    """(pos_embed_max_pos, base_height, base_width): the pixel-space (seconds, pixels, pixels) extents
    positions are divided by."""
    vae_scale: tuple[int, int, int] = (8, 32, 32)
    """The VAE's (t, h, w) compression that maps latent positions to pixel positions (vae_scale_factors)."""
    causal_offset: int = Field(1, ge=0)
    """The causal VAE's first latent frame covers this many pixel frames (causal_offset)."""
    fps: float = Field(24.0, gt=0)
    """Frame rate RoPE's time axis assumes, in seconds (the pipeline's frame_rate)."""
    gated_attention: bool = False
    """Per-head gates 2 sigmoid(Linear(x)) on the attentions' outputs (gated_attn; LTX-2.3)."""
    prompt_modulation: bool = False
    """The caption cross-attention modulated: its query by three more rows of each block's table, the
    caption by `prompt_scale_shift_table` (cross_attn_mod; LTX-2.3)."""
    prompt_modulation_per_step: bool = True
    """With `prompt_modulation`, the caption's modulation also follows the noise level (`prompt_adaln`);
    False: the table alone (use_prompt_adaln_single)."""
    caption_projection: bool = True
    """The caption goes through `caption_projection`; False: the connector already projects it to the
    width (use_prompt_embeddings; LTX-2.3)."""
    ff_bias: bool = True
    """The feed-forwards' biases (ff_bias)."""
    eps: float = Field(1e-6, gt=0)
    """The blocks' RMSNorm and q/k RMSNorm epsilon (norm_eps)."""
    audio: bool = False
    """The audio stream: not built (see the module's docstring); refused when set."""
    attention: Literal["sdpa", "flex", "flash", "dense"] = "sdpa"
    sdpa_backend: Literal["auto", "cudnn", "flash", "efficient", "math"] = "auto"

    @model_validator(mode="after")
    def _check(self) -> LTX2Model:
        if self.audio:
            raise ValueError(
                "audio: LTX-2's audio stream is not built yet (the video path runs with the audio "
                "cross-attention off); set it to false"
            )
        if self.patch != (1, 1, 1):
            raise ValueError(
                f"patch: LTX-2 is built for its published patch (1, 1, 1), got {list(self.patch)}"
            )
        if self.hidden % self.heads or (self.hidden // self.heads) % 2:
            raise ValueError(f"hidden: must be an even head size times heads={self.heads}, got {self.hidden}")
        if not self.caption_projection and self.text_dim != self.hidden:
            raise ValueError(
                f"text_dim: without caption_projection the caption is read at the width {self.hidden}, "
                f"got {self.text_dim}"
            )
        return self

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def patch_dim(self) -> int:
        return self.in_channels
