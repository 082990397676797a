"""`tokenizer`: the video tokenizer of `vidforge tokenize` and `infer` (diffusers causal 3D VAE or the pixel tokenizer)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from vidforge.section import Section


class Finetune(Section):
    """`vidforge tokenize finetune`: fine-tune (and optionally grow) the diffusers VAE at `tokenizer.path`.
    Loss = recon_weight x MSE or L1 + kl_weight x KL + lpips_weight x LPIPS, + gan_weight x the hinge GAN
    loss of a 3D patch discriminator from step `gan_start` on. Batch per step = batch x data-parallel ranks."""

    steps: int = Field(1000, ge=1)
    """Optimizer steps to run (a resumed run continues to this step)."""
    batch: int = Field(1, ge=1)
    """Clips per rank per step."""
    lr: float = Field(1e-5, gt=0)
    """AdamW learning rate of the VAE, after a linear warm-up; constant after it."""
    disc_lr: float = Field(1e-4, gt=0)
    """AdamW learning rate of the discriminator."""
    warmup_steps: int = Field(0, ge=0)
    """Linear warm-up from 0 to lr."""
    frames: int = Field(9, ge=1)
    """Frames per training clip (the first ones; must be temporal_compression x k + 1)."""
    size: list[int] = [64, 64]
    """Height and width each clip is resized and centre-cropped to (multiples of the spatial compression)."""
    holdout: int = Field(1, ge=0)
    """Clips held out of training (the first ones in name order) for PSNR, SSIM and LPIPS."""
    recon: Literal["mse", "l1"] = "mse"
    """Pixel reconstruction loss."""
    recon_weight: float = Field(1.0, ge=0)
    """Weight of the pixel reconstruction loss."""
    kl_weight: float = Field(1e-6, ge=0)
    """Weight of the KL divergence of the posterior from N(0, 1) (mean over latent elements)."""
    lpips_weight: float = Field(0.1, ge=0)
    """Weight of LPIPS (mean over frames); 0 skips it in the loss (it is still measured on held-out clips)."""
    lpips_net: Literal["alex", "vgg", "squeeze"] = "alex"
    """LPIPS backbone."""
    lpips_backbone: str | None = None
    """Local torchvision state dict of the backbone (e.g. alexnet-owt-7be5be79.pth); None: random
    backbone weights (tests; LPIPS numbers are then not comparable to published ones)."""
    gan_weight: float = Field(0.1, ge=0)
    """Weight of the generator's GAN loss once the discriminator has started."""
    gan_start: int = Field(500, ge=0)
    """Step from which the discriminator trains and the GAN loss is added."""
    disc_channels: int = Field(32, ge=1)
    """Width of the patch discriminator's first layer (doubled at each of its 3 strided layers)."""
    extra_spatial_levels: int = Field(0, ge=0, le=2)
    """Extra encoder/decoder levels, each 2x more spatial compression (1: 8x -> 16x); new tensors start
    random, the rest from the pretrained VAE. (More temporal compression is not offered: diffusers'
    AutoencoderKLWan encodes in 4-frame chunks, which a third halving of time cannot take.)"""
    log_every: int = Field(10, ge=1)
    """Losses to metrics.jsonl every this many steps (and at the last)."""
    eval_every: int = Field(100, ge=1)
    """Held-out PSNR, SSIM and LPIPS every this many steps (and at the start and end)."""
    grid_every: int = Field(100, ge=1)
    """A reconstruction grid PNG (original row above reconstruction) every this many steps."""
    checkpoint_every: int = Field(100, ge=1)
    """A DCP checkpoint every this many steps (and at the last); a rerun resumes from the latest."""
    keep_checkpoints: int = Field(2, ge=1)
    """Complete checkpoints kept (older ones deleted)."""
    seed: int = 0
    """Seeds the discriminator's and new VAE tensors' initialisation, the clip order and the posterior noise."""


class Tokenizer(Section):
    """The video tokenizer of `vidforge tokenize` and `infer` (diffusers causal 3D VAE or the pixel tokenizer)."""

    kind: Literal["pixel", "wan", "cogvideox", "hunyuan", "hunyuanvideo15", "ltx", "ltx2video"] = "pixel"
    """`pixel`: weight-free space-to-depth (demo, tests). `wan`: diffusers AutoencoderKLWan; `cogvideox`,
    `hunyuan`, `hunyuanvideo15` (HunyuanVideo-1.5's), `ltx`, `ltx2video` (LTX-2's): the diffusers causal 3D VAEs of those models."""
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
    finetune: Finetune = Finetune()
    """`vidforge tokenize finetune`."""
    image_encoder: str | None = None
    """Image-to-video models with model.image_dim > 0: the CLIP vision folder whose penultimate hidden
    states of a clip's first frame `tokenize` keeps and `infer --image` reads (a diffusers I2V pipeline's
    image_encoder/; its preprocessor config in the folder itself or in image_processor/ beside it)."""

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
