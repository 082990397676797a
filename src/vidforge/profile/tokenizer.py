"""`tokenizer`: the video tokenizer of `vidforge tokenize` and `infer` (diffusers causal 3D VAE or the pixel tokenizer)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from vidforge.profile.base import Section


class Tokenizer(Section):
    """The video tokenizer of `vidforge tokenize` and `infer` (diffusers causal 3D VAE or the pixel tokenizer)."""

    kind: Literal["pixel", "wan", "cogvideox", "hunyuan", "ltx"] = "pixel"
    """`pixel`: weight-free space-to-depth (demo, tests). `wan`: diffusers AutoencoderKLWan; `cogvideox`,
    `hunyuan`, `ltx`: the diffusers causal 3D VAEs of those models."""
    path: str | None = None
    """Local diffusers model folder (the one `save_pretrained` writes, with config.json and weights)."""
    config: str | None = None
    """A JSON file of the VAE's init arguments: builds it with random weights (tests, dry runs). Ignored
    when `path` is given."""
    temporal_compression: int = Field(4, ge=1)
    """Frames per latent frame after the first (causal: 4k+1 frames -> k+1). For diffusers VAEs this is
    read from the model and must agree."""
    spatial_compression: int = Field(8, ge=1)
    """Pixels per latent row and column. For diffusers VAEs read from the model and must agree."""
    normalize: bool = True
    """Store latents as (z - latents_mean) / latents_std (per channel, from the VAE's config; for VAEs
    with only a scaling factor, z x scaling_factor). The pixel tokenizer is never normalised."""
    tiling: bool = False
    """Encode in overlapping spatial tiles, blended at the seams (bounds memory at high resolution)."""
    tile_size: int = Field(256, ge=16)
    """Tile height and width in pixels when tiling."""
    tile_stride: int = Field(192, ge=8)
    """Distance between tile origins in pixels; tile_size - tile_stride pixels are blended."""
    frame_batch: int = Field(0, ge=0)
    """VAEs that encode whole clips at once (CogVideoX): latent frames per temporal batch, 0 = the VAE's
    default. Wan and the pixel tokenizer already work through a clip causally in chunks."""
    batch_size: int = Field(1, ge=1)
    """Clips of one shape encoded together."""
    device: str = "auto"
    """`auto` (cuda when available), `cpu`, `cuda`, `cuda:1`, ..."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Compute dtype of the VAE (bfloat16 on GPUs); latents are stored as float32 .npy."""
    prefetch: int = Field(4, ge=0)
    """Clips decoded and resized ahead of the encoder by background threads (hides video decoding)."""

    @model_validator(mode="after")
    def _check(self) -> Tokenizer:
        if self.tile_stride > self.tile_size:
            raise ValueError(
                f"tile_stride: must be <= tokenizer.tile_size={self.tile_size}, got {self.tile_stride}"
            )
        if self.tile_size % self.spatial_compression or self.tile_stride % self.spatial_compression:
            raise ValueError(
                f"tile_size: tile_size and tile_stride must be multiples of spatial_compression="
                f"{self.spatial_compression}, got {self.tile_size}, {self.tile_stride}"
            )
        return self
