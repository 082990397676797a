"""The profile's tokenizer (`profile.tokenizer`): the weight-free pixel tokenizer or a diffusers VAE, both
`interface.VideoTokenizer`s."""

from __future__ import annotations

from vidforge.device import select_device
from vidforge.errors import UserInputError
from vidforge.profile import RunProfile
from vidforge.tokenizers.interface import VideoTokenizer


def build_tokenizer(profile: RunProfile, device: str | None = None) -> VideoTokenizer:
    """The profile's tokenizer (`profile.tokenizer`)."""
    cfg = profile.tokenizer
    dev = select_device(device or cfg.device, "tokenizer.device")
    if cfg.kind == "pixel":
        from vidforge.tokenizers.pixel import PixelTokenizer

        return PixelTokenizer(cfg.temporal_compression, cfg.spatial_compression, device=dev)
    if cfg.path is None and cfg.config is None:
        raise UserInputError(
            f"tokenizer.path: the {cfg.kind} VAE needs a local diffusers folder (or tokenizer.config, "
            "a JSON of init arguments, for random weights); or use tokenizer.kind=pixel"
        )
    from vidforge.tokenizers.vae import DiffusersVAE

    return DiffusersVAE(
        cfg.kind,
        path=cfg.path,
        config=cfg.config,
        device=dev,
        dtype=cfg.dtype,
        normalize=cfg.normalize,
        tiling=cfg.tiling,
        tile_size=cfg.tile_size,
        tile_stride=cfg.tile_stride,
        frame_batch=cfg.frame_batch,
        expect=(cfg.temporal_compression, cfg.spatial_compression),
    )
