"""The demo runs end to end and its model learns: `commands/demo.sh` (the whole pipeline, default profile,
CPU) writes the three prompt videos, and the trained model, given its "a red square moving right" training
clips drowned in noise (sigma 1: as much noise as signal, and more), gives back a red square on the clean
clips' path, frame by frame, moving right. A colour-centroid tracker judges it, checked itself on the
source video; the same check on an untrained model of the same shape fails, so passing means training.

Why not judge the videos sampled from pure noise: after the few CPU minutes a test can afford, where the
tiny model places the square from noise varies from machine to machine (floating-point order changes the
training trajectory), while what it learnt about its data does not. `make demo` trains longer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from vidforge.bench.prompt_track import COLOURS, decode
from vidforge.data.shard_index import read_index
from vidforge.data.shard_reader import iter_shard
from vidforge.diffusion import build_objective
from vidforge.models import build_model, load_model
from vidforge.profile import load_profile
from vidforge.tokenizers.base import build_tokenizer
from vidforge.tokenizers.tokenize import decode as decode_latent

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "a red square moving right"
TRAIN_STEPS = 1500


def red_centroids(frames: np.ndarray, min_pixels: int = 3) -> list[float | None]:
    """x of the red pixels' centroid in each frame (None where too few are red)."""
    rgb = frames.astype(int)
    red = COLOURS["red"](rgb[..., 0], rgb[..., 1], rgb[..., 2])
    out: list[float | None] = []
    for mask in red:
        ys, xs = np.nonzero(mask)
        out.append(float(xs.mean()) if len(xs) >= min_pixels else None)
    return out


def test_tracker_sees_the_training_clip_move_right(sample_videos) -> None:
    # The tracker itself, on the source clip: the red square goes right by 2 px a frame.
    xs = red_centroids(decode(sample_videos / "red_square.mp4"))
    assert all(x is not None for x in xs)
    assert xs[-1] - xs[0] == pytest.approx(2 * (len(xs) - 1), abs=2)


def _follows(track: list[float | None], clean: list[float]) -> bool:
    """A red blob in every frame, on average within 1.2 px of the clean clip's (none off by more than
    2.5 px; the square is 6 px wide here), moving right (the clip: 0.75 px a frame)."""
    if any(x is None for x in track):
        return False
    error = np.abs(np.array(track) - np.array(clean))
    slope = np.polyfit(np.arange(len(track)), np.array(track), 1)[0]
    return bool(error.mean() <= 1.2 and error.max() <= 2.5 and slope > 0.3)


def _red_square_clips(latents: Path) -> list[dict]:
    index = read_index(latents)
    samples = []
    for entry in index.shards:
        for sample in iter_shard(index.path(entry), entry):
            if sample["json"].get("caption") == PROMPT:
                samples.append(sample)
    return samples


@torch.no_grad()
def _denoised_tracks(model, edm, tokenizer, samples: list[dict], sigma: float) -> list[tuple[list, list]]:
    out = []
    for i, sample in enumerate(samples):
        z = torch.from_numpy(sample["latent.npy"]).float()[None]
        text = torch.from_numpy(sample["text_emb.npy"]).float()[None]
        mask = torch.from_numpy(sample["text_mask.npy"]).bool()[None]
        noisy = z + sigma * torch.randn(z.shape, generator=torch.Generator().manual_seed(i))
        denoised = edm.denoise(
            lambda x, c, text=text, mask=mask: model(x, c, text, mask), noisy, torch.tensor([sigma])
        )
        clean = red_centroids(decode_latent(tokenizer, z[0]))
        out.append((red_centroids(decode_latent(tokenizer, denoised[0])), clean))
    return out


@pytest.mark.slow
def test_demo_runs_and_its_model_denoises_the_red_square(tmp_path) -> None:
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "VIDFORGE": str(Path(sys.executable).with_name("vidforge")),
        "TRAIN_STEPS": str(TRAIN_STEPS),
    }
    proc = subprocess.run(
        ["bash", "commands/demo.sh", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]

    # The pipeline's output: one video per prompt of the profile's size, and the contact sheet.
    profile = load_profile(str(tmp_path / "train" / "export" / "profile.yaml"))
    videos = sorted((tmp_path / "samples").glob("*.mp4"))
    assert [v.name for v in videos] == [
        "000_a-red-square-moving-right.mp4",
        "001_a-green-square-moving-right.mp4",
        "002_a-white-square-moving-down.mp4",
    ]
    for video in videos:
        assert decode(video).shape == (profile.infer.frames, profile.infer.height, profile.infer.width, 3)
    assert (tmp_path / "samples" / "contact_sheet.png").stat().st_size > 0
    for run in ("captioned", "train", "samples"):  # the demo's review pages
        assert (tmp_path / run / "review" / "index.html").is_file()

    # What the model learnt: its training clips of the red square, denoised from sigma 1.
    samples = _red_square_clips(tmp_path / "latents")
    assert len(samples) == 2  # the demo's red_square video and the first shot of `cuts`
    tokenizer = build_tokenizer(profile, "cpu")
    edm = build_objective(profile.diffusion)
    trained = load_model(tmp_path / "train" / "export").eval()
    for track, clean in _denoised_tracks(trained, edm, tokenizer, samples, sigma=1.0):
        assert all(x is not None for x in clean), f"the tracker misses the clean clip: {clean}"
        assert _follows(track, clean), f"denoised red square {track} does not follow the clip's {clean}"

    # The control: an untrained model of the same shape (adaLN-zero: D(x) = c_skip x) does not pass.
    torch.manual_seed(0)
    untrained = build_model(profile.model).eval()
    assert not any(_follows(t, c) for t, c in _denoised_tracks(untrained, edm, tokenizer, samples, 1.0))
