"""Motion score: dense optical flow (OpenCV Farneback) between consecutive frames, on grayscale frames
resized so their shorter side is `size` pixels. A pair's score is the mean flow magnitude (pixels per
frame at that size); a clip's is the mean over its sampled pairs. Too little motion means a static clip,
too much a shaky one; both thresholds live in the profile."""

from __future__ import annotations

import cv2
import numpy as np

from vidforge.curate.captioners import evenly_spaced

# Farneback parameters: a 3-level pyramid with 15-pixel windows follows motions of a few pixels per
# frame at 128 px; the rest are OpenCV's documented defaults.
FARNEBACK = {
    "pyr_scale": 0.5,
    "levels": 3,
    "winsize": 15,
    "iterations": 3,
    "poly_n": 5,
    "poly_sigma": 1.2,
    "flags": 0,
}


def pair_starts(num_frames: int, pairs: int) -> list[int]:
    """First frames of `pairs` evenly spaced pairs (t, t + 1) in a clip of `num_frames` frames."""
    return evenly_spaced(num_frames - 1, pairs) if num_frames >= 2 else []


def to_gray(frame: np.ndarray, size: int) -> np.ndarray:
    """RGB uint8 -> grayscale, resized so the shorter side is `size` (never upscaled)."""
    gray = cv2.cvtColor(frame, cv2.COLOR_RGB2GRAY) if frame.ndim == 3 else frame
    h, w = gray.shape
    scale = size / min(h, w)
    if scale < 1:
        gray = cv2.resize(
            gray, (max(1, round(w * scale)), max(1, round(h * scale))), interpolation=cv2.INTER_AREA
        )
    return gray


def flow_magnitude(a: np.ndarray, b: np.ndarray, size: int = 128) -> float:
    """Mean magnitude of the dense flow from frame `a` to frame `b`."""
    flow = cv2.calcOpticalFlowFarneback(to_gray(a, size), to_gray(b, size), None, **FARNEBACK)
    return float(np.linalg.norm(flow, axis=-1).mean())


def motion_score(pairs: list[tuple[np.ndarray, np.ndarray]], size: int = 128) -> float:
    """Mean over frame pairs of the mean flow magnitude; NaN without pairs (a one-frame clip)."""
    if not pairs:
        return float("nan")
    return float(np.mean([flow_magnitude(a, b, size) for a, b in pairs]))
