"""The colour-centroid tracker that judges the demo's output ("a red square moving right" should show a
red blob moving right), checked on the training clip itself. The test that runs the demo and applies it
to the generated video comes with a demo configuration that learns the square (see docs/benchmarks.md)."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
import pytest


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
