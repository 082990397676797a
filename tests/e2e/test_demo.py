"""The demo learns: `commands/demo.sh` (the whole pipeline, default profile, CPU) ends with a model whose
video for "a red square moving right" shows a red blob moving right, judged by a colour-centroid tracker
at a loose threshold (the tracker itself is checked on the training clip)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import av
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


def red_centroids(frames: np.ndarray, min_pixels: int = 3) -> list[float | None]:
    """x of the red pixels' centroid in each frame (None where too few are red)."""
    rgb = frames.astype(int)
    red = (rgb[..., 0] > 140) & (rgb[..., 1] < 110) & (rgb[..., 2] < 110)
    out: list[float | None] = []
    for mask in red:
        ys, xs = np.nonzero(mask)
        out.append(float(xs.mean()) if len(xs) >= min_pixels else None)
    return out


def decode(path: Path) -> np.ndarray:
    with av.open(str(path)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def test_tracker_sees_the_training_clip_move_right(sample_videos) -> None:
    # The tracker itself, on the source clip: the red square goes right by 2 px a frame.
    xs = red_centroids(decode(sample_videos / "red_square.mp4"))
    assert all(x is not None for x in xs)
    assert xs[-1] - xs[0] == pytest.approx(2 * (len(xs) - 1), abs=2)


@pytest.mark.slow
def test_demo_video_shows_a_red_blob_moving_right(tmp_path) -> None:
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "VIDFORGE": str(Path(sys.executable).with_name("vidforge")),
    }
    proc = subprocess.run(
        ["bash", "commands/demo.sh", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=2400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    xs = red_centroids(decode(tmp_path / "samples" / "000_a-red-square-moving-right.mp4"))
    seen = [(t, x) for t, x in enumerate(xs) if x is not None]
    assert len(seen) >= 0.6 * len(xs), f"a red blob in too few frames: {xs}"
    t, x = np.array(seen).T
    assert np.polyfit(t, x, 1)[0] > 0.2 and x[-1] - x[0] > 1.5, f"the red centroid does not move right: {xs}"
