"""`bench plan --clip FRAMESxHEIGHTxWIDTH` in the latents of the model's own VAE (`FamilySpec.vae_compression`,
the one owner): Wan2.1's 4 x 8 x 8, Wan2.2 TI2V-5B's 4 x 16 x 16, HunyuanVideo-1.5's 4 x 16 x 16 and
LTX-2's 8 x 32 x 32, each held to diffusers' VAE class with the published compression; a clip the VAE
cannot encode is refused in one line naming its rule."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vidforge.cli._options import profile_from  # noqa: E402
from vidforge.cli.app import app  # noqa: E402
from vidforge.cli.bench import _clip_sets, _machine_sets  # noqa: E402


def _wan21():
    from diffusers import AutoencoderKLWan

    defaults = inspect.signature(AutoencoderKLWan.__init__).parameters  # Wan2.1's VAE is the default
    return defaults["scale_factor_temporal"].default, defaults["scale_factor_spatial"].default


def _wan22():
    from wan22_ti2v_fixtures import tiny_wan22_vae

    config = tiny_wan22_vae().config
    return config.scale_factor_temporal, config.scale_factor_spatial


def _hunyuan15():
    from diffusers import AutoencoderKLHunyuanVideo15

    defaults = inspect.signature(AutoencoderKLHunyuanVideo15.__init__).parameters
    return defaults["temporal_compression_ratio"].default, defaults["spatial_compression_ratio"].default


def _ltx2():
    from diffusers import AutoencoderKLLTX2Video

    with torch.device("meta"):  # LTX-2's published VAE layout (diffusers' defaults are LTX-Video 0.9's)
        vae = AutoencoderKLLTX2Video(
            block_out_channels=(8, 8, 8), decoder_block_out_channels=(8, 8, 8), layers_per_block=(1, 1, 1, 1),
            decoder_layers_per_block=(1, 1, 1, 1), spatio_temporal_scaling=(True, True, True),
            decoder_spatio_temporal_scaling=(True, True, True), decoder_inject_noise=(False,) * 4,
            downsample_type=("spatiotemporal",) * 3, upsample_type=("spatiotemporal",) * 3,
            upsample_residual=(False,) * 3, upsample_factor=(1, 1, 1), patch_size=4, patch_size_t=1,
        )  # fmt: skip
    return vae.temporal_compression_ratio, vae.spatial_compression_ratio


@pytest.mark.parametrize(
    ("preset", "clip", "vae"),
    [
        ("wan2.1-14b", (81, 480, 832), _wan21),
        ("wan2.2-ti2v-5b", (121, 704, 1280), _wan22),
        ("hunyuanvideo1.5-480p-t2v", (121, 480, 848), _hunyuan15),
        ("ltx-2", (121, 512, 768), _ltx2),
    ],
)
def test_a_clip_is_planned_in_the_latents_of_the_models_vae(preset, clip, vae) -> None:
    ct, cs = vae()
    given = _machine_sets(preset, None, None)
    sets = _clip_sets(profile_from(None, given), "x".join(map(str, clip)), from_folder=False)
    frames, height, width = clip
    expected = [(frames - 1) // ct + 1, height // cs, width // cs]
    profile = profile_from(None, [*given, *sets])
    b = profile.bench
    assert [b.latent_frames, b.latent_height, b.latent_width] == expected
    assert (profile.tokenizer.temporal_compression, profile.tokenizer.spatial_compression) == (ct, cs)


def test_a_clip_the_vae_cannot_encode_is_refused_naming_its_rule() -> None:
    # 85 frames are 4k+1 (Wan's) but not 8k+1 (LTX-2's); 480 is a multiple of 32, 840 is not
    for clip, says in (("85x480x832", "frames must be 8k+1"), ("121x480x840", "multiples of 32")):
        result = CliRunner().invoke(app, ["bench", "plan", "--model", "ltx-2", "--clip", clip])
        assert result.exit_code == 2 and says in result.output, result.output
