"""diffusers causal 3D VAEs as video tokenizers: Wan (AutoencoderKLWan, the default), CogVideoX, HunyuanVideo,
HunyuanVideo-1.5, LTX-Video and LTX-2, loaded from a local diffusers folder or built with random weights from a JSON config.

Latents are the posterior mode (deterministic), normalised as the models' pipelines expect:
(z - latents_mean) x scaling_factor / latents_std, each term where the VAE defines it (Wan: mean and std
per channel; LTX and LTX-2: mean, std and a scaling factor; CogVideoX and both HunyuanVideos: a scaling factor).
An LTX VAE whose decoder reads a timestep (`timestep_conditioning`: LTX-Video 0.9.1 on; LTX-2's published
VAE has it off) decodes as its pipelines do by default: at timestep 0, no noise mixed in.

Memory: the VAEs work through a clip causally in temporal chunks themselves (Wan: 4 frames at a time
with a feature cache); spatial tiling (diffusers' own, blended at the seams) bounds activations at high
resolution; `frame_batch` sets the temporal batch of VAEs that have one (CogVideoX)."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import torch

from vidforge.errors import UserInputError
from vidforge.tokenizers.interface import VideoTokenizer

CLASSES = {
    "wan": "AutoencoderKLWan",
    "cogvideox": "AutoencoderKLCogVideoX",
    "hunyuan": "AutoencoderKLHunyuanVideo",
    "hunyuanvideo15": "AutoencoderKLHunyuanVideo15",
    "ltx": "AutoencoderKLLTXVideo",
    "ltx2video": "AutoencoderKLLTX2Video",
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def vae_class(kind: str) -> type:
    import diffusers

    return getattr(diffusers, CLASSES[kind])


def _first(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


class DiffusersVAE(VideoTokenizer):
    def __init__(
        self,
        kind: str = "wan",
        *,
        path: str | None = None,
        config: str | dict | None = None,
        device: Any = "cpu",
        dtype: str = "float32",
        normalize: bool = True,
        tiling: bool = False,
        tile_size: int = 256,
        tile_stride: int = 192,
        frame_batch: int = 0,
        seed: int = 0,
        expect: tuple[int, int] | None = None,
    ):
        if kind not in CLASSES:
            raise UserInputError(
                f"tokenizer.kind: unknown VAE {kind!r}; use one of {sorted(CLASSES)} or pixel"
            )
        cls = vae_class(kind)
        self.kind, self.source = kind, path or (config if isinstance(config, str) else "config")
        if path is not None:
            if not Path(path, "config.json").is_file():
                raise UserInputError(f"tokenizer.path: not a diffusers model folder (no config.json): {path}")
            vae = cls.from_pretrained(path, torch_dtype=DTYPES[dtype])
        else:
            if isinstance(config, str):
                try:
                    config = json.loads(Path(config).read_text())
                except (OSError, json.JSONDecodeError) as err:
                    raise UserInputError(f"tokenizer.config: cannot read {config}: {err}") from None
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                vae = cls.from_config(config).to(DTYPES[dtype])
        self.device = torch.device(device)
        self.dtype = DTYPES[dtype]
        self.vae = vae.eval().requires_grad_(False).to(self.device)
        cfg = self.vae.config
        self.temporal_compression = int(
            _first(
                cfg.get("scale_factor_temporal"),
                cfg.get("temporal_compression_ratio"),
                getattr(self.vae, "temporal_compression_ratio", None),
                4,
            )
        )
        self.spatial_compression = int(
            _first(
                cfg.get("scale_factor_spatial"),
                cfg.get("spatial_compression_ratio"),
                getattr(self.vae, "spatial_compression_ratio", None),
                2 ** (len(cfg.get("block_out_channels", [0] * 4)) - 1),
            )
        )
        if expect is not None and expect != (self.temporal_compression, self.spatial_compression):
            raise UserInputError(
                f"tokenizer.temporal_compression/spatial_compression: the {kind} VAE compresses by "
                f"({self.temporal_compression}, {self.spatial_compression}), the profile says {expect}; set them to match"
            )
        self.latent_channels = int(_first(cfg.get("z_dim"), cfg.get("latent_channels")))
        self.normalize = normalize
        buffers = dict(self.vae.named_buffers())  # LTX keeps mean and std as buffers, Wan in its config
        mean = _first(cfg.get("latents_mean"), buffers.get("latents_mean"))
        std = _first(cfg.get("latents_std"), buffers.get("latents_std"))
        c = self.latent_channels
        self.mean = torch.as_tensor(mean if mean is not None else [0.0] * c).float().cpu().view(1, c, 1, 1, 1)
        self.std = torch.as_tensor(std if std is not None else [1.0] * c).float().cpu().view(1, c, 1, 1, 1)
        self.scaling = float(cfg.get("scaling_factor", 1.0) or 1.0)
        self.tiling = tiling
        if tiling:
            wanted = {
                "tile_sample_min_height": tile_size,
                "tile_sample_min_width": tile_size,
                "tile_sample_stride_height": tile_stride,
                "tile_sample_stride_width": tile_stride,
            }
            accepted = inspect.signature(self.vae.enable_tiling).parameters
            self.vae.enable_tiling(**{k: v for k, v in wanted.items() if k in accepted})
        if frame_batch and hasattr(self.vae, "num_latent_frames_batch_size"):
            self.vae.num_latent_frames_batch_size = frame_batch

    def _norm(self, z: torch.Tensor) -> torch.Tensor:
        if not self.normalize:
            return z
        return (z - self.mean.to(z.device)) * self.scaling / self.std.to(z.device)

    def _denorm(self, z: torch.Tensor) -> torch.Tensor:
        if not self.normalize:
            return z
        return z * self.std.to(z.device) / self.scaling + self.mean.to(z.device)

    @torch.inference_mode()
    def encode(self, video: torch.Tensor) -> torch.Tensor:
        self.check_input(video)
        z = self.vae.encode(video.to(self.device, self.dtype)).latent_dist.mode()
        return self._norm(z.float())

    @torch.inference_mode()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        z = self._denorm(latents.to(self.device).float()).to(self.dtype)
        if self.vae.config.get("timestep_conditioning"):
            # An LTX VAE whose decoder reads a timestep: the LTX and LTX-2 pipelines' default, decode_timestep
            # 0.0 with decode_noise_scale equal to it (the latents decoded without noise mixed in).
            return self.vae.decode(z, torch.zeros(z.shape[0], device=z.device, dtype=z.dtype)).sample.float()
        return self.vae.decode(z).sample.float()

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "class": CLASSES[self.kind],
            "source": str(self.source),
            "temporal_compression": self.temporal_compression,
            "spatial_compression": self.spatial_compression,
            "latent_channels": self.latent_channels,
            "normalized": self.normalize,
            "tiling": self.tiling,
            "dtype": str(self.dtype).removeprefix("torch."),
        }
