"""README's TI2V-5B and Wan2.1-I2V recipes take their optimizer steps at the shapes README prints (issue 44):
`vidforge finetune` (README: "runs the same chain in one command") with each recipe's profile, buckets and
train settings (`--full --set train.lr=1e-5` at 704x1280x121 for TI2V; LoRA rank 32, alpha 32, lr 1e-4 at
480x832x81 for I2V), on one generated video long enough for the frame
bucket and a tiny folder in the published layout with the thinnest VAE diffusers' AutoencoderKLWan builds
(one channel, no residual blocks): the VAE's encoding at the recipe's size is the cost, so they are opt-in,
VIDFORGE_TEST_RECIPES=1."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from recipes import (  # noqa: E402
    WAN_HERE,
    assert_trained,
    exported,
    finetune,
    run_profile,
    thinnest_wan21_vae,
    write_videos,
)
from wan_fixtures import text_parts, tiny_transformer  # noqa: E402
from wan_i2v_fixtures import save_tiny_wan_i2v_pipeline  # noqa: E402

from vidforge.data.token_budget import sample_tokens  # noqa: E402

pytestmark = pytest.mark.skipif(
    os.environ.get("VIDFORGE_TEST_RECIPES") != "1",
    reason="minutes of VAE encoding: set VIDFORGE_TEST_RECIPES=1 to train README's TI2V and I2V recipes",
)
TI2V_CHANNELS = 48  # Wan2.2-TI2V-5B's VAE z_dim


def _save_thinnest_ti2v_pipeline(root: Path) -> Path:
    """Wan2.2 TI2V-5B's layout (`WanPipeline(expand_timesteps=True)`, a 5.0 flow shift) with its VAE's
    structure (is_residual, 2x2 pixel patches into 12 channels, 4x16x16, 48 latent channels) one channel wide."""
    from diffusers import AutoencoderKLWan, WanPipeline

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    vae = AutoencoderKLWan(
        base_dim=1, decoder_base_dim=1, z_dim=TI2V_CHANNELS, dim_mult=[1, 1, 1, 1], num_res_blocks=0,
        temperal_downsample=[False, True, True], is_residual=True, in_channels=12, out_channels=12,
        patch_size=2, scale_factor_spatial=16, scale_factor_temporal=4,
        latents_mean=rng.normal(0, 0.2, TI2V_CHANNELS).tolist(),
        latents_std=rng.uniform(0.5, 2.0, TI2V_CHANNELS).tolist(),
    )  # fmt: skip
    transformer = tiny_transformer(in_channels=TI2V_CHANNELS, out_channels=TI2V_CHANNELS)
    WanPipeline(transformer=transformer, vae=vae, expand_timesteps=True, **text_parts(5.0)).save_pretrained(
        root
    )
    return root


def _save_thinnest_i2v_pipeline(root: Path) -> Path:
    """`wan_i2v_fixtures`' Wan2.1-I2V folder (CLIP image encoder, 36-channel transformer) with its VAE swapped
    for the thinnest one of the same 4 latent channels and statistics."""
    save_tiny_wan_i2v_pipeline(root)
    shutil.rmtree(root / "vae")
    thinnest_wan21_vae().save_pretrained(root / "vae")
    return root


def _latents(out: Path) -> list[dict]:
    from vidforge.data.loader import ShardLoader

    return list(ShardLoader([out / "latents"], epochs=1))


def _finetune_and_check(tmp_path, base: Path, videos: Path, recipe: tuple[str, ...], shape, fps, tokens):
    out = tmp_path / "run"
    args = ("--profile", "dit1b_1xh200", *recipe, "--steps", "2", "--validate-every", "0")
    result = finetune(videos, base, out, *args, sets=WAN_HERE)
    profile = run_profile(out)
    frames, height, width = shape
    assert profile["data"]["buckets"] == [[height, width]] and profile["data"]["frame_buckets"] == [frames]
    assert profile["data"]["token_budget"] == tokens and profile["curation"]["fps"] == fps
    assert_trained(out, 2)
    assert "skipping" not in result.output
    export = exported(out)
    assert export["step"] == 2
    (sample,) = _latents(out)  # the clip the steps trained on, at the bucket's shape
    assert sample_tokens(sample["latent.npy"].shape, (1, 2, 2)) == tokens
    return out, profile, export


@pytest.mark.slow(minutes=5)
def test_readme_ti2v_5b_recipe_trains_at_704x1280x121(tmp_path) -> None:
    base = _save_thinnest_ti2v_pipeline(tmp_path / "Wan2.2-TI2V-5B-tiny-Diffusers")
    videos = write_videos(tmp_path / "videos", (124,), 704, 1280, fps=24)
    recipe = ("--full", "--set", "data.buckets=[[704,1280]]", "--set", "data.frame_buckets=[121]",
              "--set", "train.lr=1e-5")  # fmt: skip
    # 121 frames through the 4x16x16 VAE and the 1x2x2 patch: 31 x 22 x 40 tokens.
    tokens = ((121 - 1) // 4 + 1) * (704 // 16 // 2) * (1280 // 16 // 2)
    out, profile, export = _finetune_and_check(tmp_path, base, videos, recipe, (121, 704, 1280), 24, tokens)
    assert tokens == 27280
    assert profile["train"]["lr"] == 1e-5 and export.get("lora") is None
    assert profile["model"]["expand_timesteps"] is True
    assert _latents(out)[0]["latent.npy"].shape == (TI2V_CHANNELS, 31, 44, 80)


@pytest.mark.slow(minutes=3)
def test_readme_i2v_recipe_trains_at_480x832x81(tmp_path) -> None:
    base = _save_thinnest_i2v_pipeline(tmp_path / "Wan2.1-I2V-14B-480P-tiny-Diffusers")
    videos = write_videos(tmp_path / "videos", (84,), 480, 832, fps=16)
    recipe = ("--set", "data.buckets=[[480,832]]", "--set", "data.frame_buckets=[81]",
              "--set", "train.lora.rank=32", "--set", "train.lora.alpha=32", "--set", "train.lr=1e-4")  # fmt: skip
    # 81 frames through Wan2.1's 4x8x8 VAE and the 1x2x2 patch: 21 x 30 x 52 tokens.
    tokens = ((81 - 1) // 4 + 1) * (480 // 8 // 2) * (832 // 8 // 2)
    out, profile, export = _finetune_and_check(tmp_path, base, videos, recipe, (81, 480, 832), 16, tokens)
    assert tokens == 32760
    assert export["lora"]["rank"] == 32 and profile["train"]["lr"] == 1e-4
    assert profile["model"]["condition_channels"] == 8  # the 4 mask channels and the first frame's 4 latents
    (sample,) = _latents(out)
    assert sample["latent.npy"].shape == (4, 21, 60, 104) and sample["condition.npy"].shape == (
        8,
        21,
        60,
        104,
    )
