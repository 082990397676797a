"""The wan family's model section: Wan's own fields beside what every family has. Its block is Wan2.1's
(`FixedBlock`: a DiT block, GELU-tanh, QK RMSNorm across all heads, RoPE only)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from vidforge.families.model import FixedBlock, Model


class WanModel(Model, FixedBlock):
    """Wan2.1/2.2's transformer (diffusers' WanTransformer3DModel, module for module)."""

    family: Literal["wan"] = "wan"
    """Wan2.1/2.2's transformer; `vidforge model import` brings its published weights in."""
    cross_attn_norm: bool = False
    """A LayerNorm (with weight and bias) on the tokens before cross-attention (Wan2.1:
    true)."""
    expand_timesteps: bool = False
    """The network conditions on an image through its first latent frame, which enters
    clean with its tokens at noise level 0 while the rest is denoised (Wan2.2 TI2V; diffusers'
    `expand_timesteps`). `infer --image` samples from one; training conditions `diffusion.image_condition`
    of its clips on their own first frame. Needs a temporal patch of 1."""
    condition_channels: int = Field(0, ge=0)
    """Latent channels read beside the noisy latents and not predicted (image-to-video:
    Wan2.1-I2V's first-frame mask, 4 per latent frame, and the VAE latent of [first frame, zeros...], 16:
    20). The input layer takes in_channels + condition_channels; the output has in_channels."""
    image_dim: int = Field(0, ge=0)
    """Width of the image embedding cross-attention also reads (Wan2.1-I2V: CLIP
    ViT-H's penultimate hidden states, 1280); 0 for none."""

    @model_validator(mode="after")
    def _check_first_frame(self) -> WanModel:
        if self.expand_timesteps and self.patch[0] != 1:
            raise ValueError(
                f"expand_timesteps: the condition frame is the first latent frame, which needs patch[0] = 1, "
                f"got {list(self.patch)}"
            )
        return self
