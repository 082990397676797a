"""`vidforge tokenize finetune` on a tiny random Wan VAE saved with save_pretrained and synthetic clips:
held-out PSNR rises over a short run; a stopped and resumed run logs the unbroken run's losses; a grown
VAE (16x spatial) loads every pretrained tensor that fits and trains; the result loads in diffusers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from vidforge.data.manifest import write_jsonl
from vidforge.data.media import write_video
from vidforge.data.testing import synthetic_frames
from vidforge.profile import load_profile
from vidforge.tokenizers import build_tokenizer, frames_to_tensor, losses
from vidforge.train.metrics import read_metrics
from vidforge.train.tokenizer_finetune import build_vae, run

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_tokenizers_vae import TINY_WAN  # noqa: E402  (the tiny Wan VAE of the tokenizer's tests)


def save_tiny_wan(path):
    from diffusers import AutoencoderKLWan

    torch.manual_seed(0)
    AutoencoderKLWan(**TINY_WAN).save_pretrained(path)
    return path


def write_clips(out, count=4):
    """A clips folder as `vidforge clip` writes it: `count` clips of 5 frames, 32x32."""
    (out / "clips").mkdir(parents=True)
    records = []
    for i in range(count):
        write_video(out / "clips" / f"c{i}.mp4", synthetic_frames(5, 32, 32, seed=i), lossless=True)
        records.append({"clip_id": f"c{i}", "media": f"clips/c{i}.mp4"})
    write_jsonl(out / "manifest.jsonl", records)
    return out


@pytest.fixture(scope="module")
def wan_dir(tmp_path_factory):
    return save_tiny_wan(tmp_path_factory.mktemp("wan"))


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    return write_clips(tmp_path_factory.mktemp("clips"))


def finetune_profile(wan_dir, *extra):
    return load_profile(
        None,
        [
            "tokenizer.kind=wan",
            f"tokenizer.path={wan_dir}",
            "tokenizer.device=cpu",
            "tokenizer.finetune.frames=1",
            "tokenizer.finetune.size=[32,32]",
            "tokenizer.finetune.lr=2e-3",
            "tokenizer.finetune.lpips_weight=0",
            "tokenizer.finetune.gan_start=2",
            "tokenizer.finetune.disc_channels=8",
            "tokenizer.finetune.log_every=1",
            "tokenizer.finetune.eval_every=100",
            "tokenizer.finetune.grid_every=100",
            *extra,
        ],
    )


STEPS = ["tokenizer.finetune.steps=6", "tokenizer.finetune.checkpoint_every=3"]


@pytest.fixture(scope="module")
def full_run(wan_dir, clips, tmp_path_factory):
    out = tmp_path_factory.mktemp("ft") / "run"
    summary = run(finetune_profile(wan_dir, *STEPS), clips, out)
    return out, summary


def _losses(run_dir):
    return {r["step"]: r for r in read_metrics(run_dir / "metrics.jsonl") if "loss" in r}


def test_heldout_psnr_rises_and_a_grid_is_written(full_run):
    run_dir, summary = full_run
    evals = [r for r in read_metrics(run_dir / "metrics.jsonl") if "val_psnr" in r]
    assert [r["step"] for r in evals] == [0, 6]
    assert evals[1]["val_psnr"] > evals[0]["val_psnr"] + 0.3, evals
    assert {"val_ssim", "val_lpips"} <= set(evals[1])
    assert "loss_disc" in _losses(run_dir)[6]  # the discriminator started at step 2
    from PIL import Image

    grid = Image.open(run_dir / "grids" / "step_00000006.png")
    assert grid.size == (32, 64)  # one frame: the original above its reconstruction


def test_stopped_and_resumed_run_logs_the_same_losses(full_run, wan_dir, clips, tmp_path):
    run(finetune_profile(wan_dir, "tokenizer.finetune.steps=3"), clips, tmp_path / "run")
    summary = run(finetune_profile(wan_dir, *STEPS), clips, tmp_path / "run")
    assert summary["resumed_from"] == 3
    unbroken, resumed = _losses(full_run[0]), _losses(tmp_path / "run")
    for step in (4, 5, 6):
        for key in ("loss", "loss_recon", "loss_kl", "loss_gan", "loss_disc"):
            assert resumed[step][key] == pytest.approx(unbroken[step][key], rel=1e-6), (step, key)


def test_result_loads_in_diffusers_and_tokenize_encodes_with_it(full_run, wan_dir):
    from diffusers import AutoencoderKLWan

    vae = AutoencoderKLWan.from_pretrained(full_run[0] / "vae")
    before = AutoencoderKLWan.from_pretrained(wan_dir)
    changed = [k for k, v in vae.state_dict().items() if not torch.equal(v, before.state_dict()[k])]
    assert len(changed) > len(vae.state_dict()) // 2  # it trained
    profile = load_profile(
        None,
        [
            "tokenizer.kind=wan",
            f"tokenizer.path={full_run[0] / 'vae'}",
            "tokenizer.normalize=false",
            "tokenizer.spatial_compression=8",
        ],
    )
    tokenizer = build_tokenizer(profile, "cpu")
    video = frames_to_tensor(synthetic_frames(5, 32, 32, seed=9))[None]
    with torch.no_grad():
        expected = vae.encode(video).latent_dist.mode()
    torch.testing.assert_close(tokenizer.encode(video), expected)


def test_grown_vae_loads_every_pretrained_tensor_that_fits_and_trains(wan_dir, clips, tmp_path):
    from diffusers import AutoencoderKLWan

    profile = finetune_profile(
        wan_dir, "tokenizer.finetune.extra_spatial_levels=1", "tokenizer.finetune.steps=2"
    )
    grown, report = build_vae(profile)
    pretrained = AutoencoderKLWan.from_pretrained(wan_dir).state_dict()
    own = grown.state_dict()
    encoder = [k for k in pretrained if k.startswith("encoder.")]
    for name in encoder:  # the encoder's levels keep their names: each tensor loads where its shape fits
        if own[name].shape == pretrained[name].shape:
            assert torch.equal(own[name], pretrained[name]), name
    fitting = sum(own[k].shape == pretrained[k].shape for k in encoder)
    assert fitting > 0.9 * len(encoder)
    assert report["new"] > 0 and report["loaded"] >= fitting
    # Every pretrained tensor found its place (the decoder's levels renamed behind the new one): loaded,
    # or reported as another shape; none left unused.
    assert report["unused"] == 0 and report["loaded"] + report["reshaped"] == len(pretrained)
    assert grown.config.scale_factor_spatial == 16
    summary = run(profile, clips, tmp_path / "run")
    assert json.loads((tmp_path / "run" / "init.json").read_text())["loaded"] == report["loaded"]
    assert summary["final_loss"] == summary["final_loss"]  # finite, not NaN
    saved = AutoencoderKLWan.from_pretrained(tmp_path / "run" / "vae")
    with torch.no_grad():
        z = saved.encode(frames_to_tensor(synthetic_frames(1, 32, 32, seed=1))[None]).latent_dist.mode()
    assert tuple(z.shape) == (1, 4, 1, 2, 2)


def test_psnr_and_ssim_against_closed_forms():
    target = torch.rand(2, 3, 2, 16, 16) * 1.2 - 0.6
    assert losses.psnr(target + 0.2, target).tolist() == pytest.approx([20.0, 20.0], abs=1e-4)  # mse 0.1^2
    assert losses.ssim(target, target).tolist() == pytest.approx([1.0, 1.0], abs=1e-6)
    # A constant image against itself shifted by d: SSIM = (2 m (m + d) + C1) / (m^2 + (m + d)^2 + C1).
    m, d, c1 = 0.4, 0.1, 0.01**2
    flat = torch.full((1, 3, 1, 16, 16), 2 * m - 1)
    expected = (2 * m * (m + d) + c1) / (m**2 + (m + d) ** 2 + c1)
    assert float(losses.ssim(flat + 2 * d, flat)[0]) == pytest.approx(expected, rel=1e-5)


def test_cli_finetune_beside_tokenize_and_a_wrong_vae_path_is_one_line_exit_2(clips, tmp_path):
    from typer.testing import CliRunner

    from vidforge.cli.app import app

    runner = CliRunner()
    result = runner.invoke(
        app,
        [
            "--json",
            "tokenize",
            "finetune",
            str(clips),
            "--run-dir",
            str(tmp_path / "r"),
            "--set",
            "tokenizer.kind=wan",
        ],
    )
    assert result.exit_code == 2
    events = [json.loads(line) for line in result.stdout.splitlines()]
    assert events[-1]["command"] == "tokenize finetune" and "tokenizer.path" in events[-1]["message"]
    # `tokenize SRC -o OUT` still runs tokenize's own command (here refusing a folder without an index).
    result = runner.invoke(app, ["--json", "tokenize", str(clips), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2
    error = json.loads(result.stdout.splitlines()[-1])
    assert error["command"] == "tokenize" and "no index.json" in error["message"]
