"""diffusers causal 3D VAE tokenizer with a tiny random Wan VAE saved and loaded in diffusers' format:
latent shapes follow the compression factors, normalisation uses the config's mean and std, tiled
encoding equals untiled within a stated tolerance."""

from __future__ import annotations

import json
from unittest import mock

import pytest
import torch

from vidforge.data.buckets import resize_crop
from vidforge.data.testing import synthetic_frames
from vidforge.errors import UserInputError
from vidforge.profile import load_profile
from vidforge.tokenizers import build_tokenizer, frames_to_tensor
from vidforge.tokenizers.vae import DiffusersVAE

TINY_WAN = {
    "base_dim": 8,
    "z_dim": 4,
    "dim_mult": [1, 2, 2, 2],
    "num_res_blocks": 1,
    "temperal_downsample": [False, True, True],
    "latents_mean": [0.1, 0.2, -0.1, 0.0],
    "latents_std": [1.5, 2.0, 0.5, 1.0],
}


@pytest.fixture(scope="module")
def wan_dir(tmp_path_factory):
    from diffusers import AutoencoderKLWan

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("wan")
    AutoencoderKLWan(**TINY_WAN).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def wan(wan_dir):
    return DiffusersVAE("wan", path=str(wan_dir))


@pytest.mark.parametrize(("frames", "height", "width"), [(1, 16, 24), (5, 16, 16), (9, 8, 16)])
def test_latent_shapes_follow_compression_factors(wan, frames, height, width):
    z = wan.encode(torch.rand(1, 3, frames, height, width) * 2 - 1)
    assert tuple(z.shape) == (1, 4, 1 + (frames - 1) // 4, height // 8, width // 8)
    assert wan.latent_shape(frames, height, width) == tuple(z.shape[1:])
    assert (wan.temporal_compression, wan.spatial_compression) == (4, 8)


def test_latents_are_normalised_by_the_configs_mean_and_std(wan_dir, wan):
    from diffusers import AutoencoderKLWan

    x = torch.rand(1, 3, 5, 16, 16) * 2 - 1
    vae = AutoencoderKLWan.from_pretrained(wan_dir)
    with torch.no_grad():
        raw = vae.encode(x).latent_dist.mode()  # diffusers directly
    mean = torch.tensor(TINY_WAN["latents_mean"]).view(1, 4, 1, 1, 1)
    std = torch.tensor(TINY_WAN["latents_std"]).view(1, 4, 1, 1, 1)
    latents = wan.encode(x)
    torch.testing.assert_close(latents, (raw - mean) / std, rtol=1e-5, atol=1e-5)
    # infer's inverse is WanPipeline's: latents / (1 / latents_std) + latents_mean, then decode.
    with torch.no_grad():
        expected = vae.decode(latents / (1.0 / std) + mean).sample
    torch.testing.assert_close(wan.decode(latents), expected, rtol=1e-5, atol=1e-5)


def test_built_from_a_json_config_and_from_the_profile(tmp_path, wan_dir):
    config = tmp_path / "wan.json"
    config.write_text(json.dumps(TINY_WAN))
    wan = ["tokenizer.kind=wan", "tokenizer.spatial_compression=8"]  # the default profile's pixel one is 4x
    profile = load_profile(None, [*wan, f"tokenizer.config={config}"])
    tok = build_tokenizer(profile)
    assert tok.latent_channels == 4 and tok.describe()["class"] == "AutoencoderKLWan"
    with pytest.raises(UserInputError, match="tokenizer.path"):
        build_tokenizer(load_profile(None, wan))
    with pytest.raises(UserInputError, match="compress"):
        build_tokenizer(
            load_profile(
                None, ["tokenizer.kind=wan", f"tokenizer.path={wan_dir}", "tokenizer.spatial_compression=4"]
            )
        )


def test_tiled_encoding_equals_untiled_within_tolerance(wan_dir, wan):
    # Smooth content (as real frames are), 5 frames of 128x128; tiles of 96 px every 64 px (32 px blended).
    frames = resize_crop(resize_crop(synthetic_frames(5, 128, 128, 0), 32, 32), 128, 128)
    x = frames_to_tensor(frames)[None]
    tiled = DiffusersVAE("wan", path=str(wan_dir), tiling=True, tile_size=96, tile_stride=64)
    with mock.patch.object(tiled.vae, "tiled_encode", wraps=tiled.vae.tiled_encode) as spy:
        z_tiled = tiled.encode(x)
    assert spy.called  # the tiled path really ran
    z = wan.encode(x)
    assert z_tiled.shape == z.shape
    # Tolerance: relative L2 error 0.1. Wan's encoder ends in a global self-attention over the latent grid,
    # which a tile cannot see past, so tiling is approximate by construction; with these random weights the
    # measured error is ~0.04 (bigger tiles and overlaps shrink it).
    rel = float((z_tiled - z).norm() / z.norm())
    assert rel < 0.1, rel


TIMESTEP_VAES = {  # tiny LTX VAEs whose decoders read a timestep (LTX-Video 0.9.1 on; LTX-2's is off)
    "ltx": {"latent_channels": 4, "block_out_channels": (8,) * 4, "decoder_block_out_channels": (8,) * 4,
            "layers_per_block": (1,) * 5, "decoder_layers_per_block": (1,) * 5,
            "decoder_inject_noise": (False,) * 5, "upsample_residual": (False,) * 4, "upsample_factor": (1,) * 4},
    "ltx2video": {"latent_channels": 4, "block_out_channels": (8,) * 3, "decoder_block_out_channels": (8,) * 3,
                  "layers_per_block": (1,) * 4, "decoder_layers_per_block": (1,) * 4,
                  "spatio_temporal_scaling": (True,) * 3, "decoder_spatio_temporal_scaling": (True,) * 3,
                  "decoder_inject_noise": (False,) * 4, "downsample_type": ("spatiotemporal",) * 3,
                  "upsample_type": ("spatiotemporal",) * 3, "upsample_residual": (False,) * 3,
                  "upsample_factor": (1,) * 3},
}  # fmt: skip


@pytest.mark.parametrize("kind", sorted(TIMESTEP_VAES))
def test_a_timestep_conditioned_ltx_vae_decodes_as_its_pipeline_does_by_default(kind) -> None:
    """The pipeline's default decode_timestep 0.0, its decode_noise_scale None (= decode_timestep: no noise
    mixed in), handed to the VAE's decode as the timestep."""
    import inspect

    from diffusers import LTX2Pipeline, LTXPipeline

    pipeline = {"ltx": LTXPipeline, "ltx2video": LTX2Pipeline}[kind]
    call = inspect.signature(pipeline.__call__).parameters
    assert (call["decode_timestep"].default, call["decode_noise_scale"].default) == (0.0, None)
    tokenizer = DiffusersVAE(kind, config={**TIMESTEP_VAES[kind], "timestep_conditioning": True})
    with torch.no_grad():  # a time embedding that is not zero, so that the timestep matters
        for p in tokenizer.vae.decoder.time_embedder.parameters():
            p.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))
    latents = torch.randn(1, 4, 2, 2, 3, generator=torch.Generator().manual_seed(0))
    z = tokenizer._denorm(latents)
    theirs = tokenizer.vae.decode(z, torch.tensor([0.0]), return_dict=False)[0]
    torch.testing.assert_close(tokenizer.decode(latents), theirs, rtol=0, atol=0)
    assert (theirs - tokenizer.vae.decode(z, torch.tensor([0.5])).sample).abs().max() > 1e-4
