"""Does a sampled video show what its prompt says: a colour-centroid tracker for the demo's prompts
("a <colour> square moving <direction>"). The demo test and bench/demo_sweep.py judge with it, so the
sweep ranks configurations by the same rule the test holds the demo to."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# RGB bounds for each colour the demo names (the sample generator's red, green and white, with slack for
# H.264 and for a model that gets the hue roughly right).
COLOURS = {
    "red": lambda r, g, b: (r > 140) & (g < 110) & (b < 110),
    "green": lambda r, g, b: (g > 110) & (r < 110) & (b < 110),
    "white": lambda r, g, b: (r > 170) & (g > 170) & (b > 170),
}
# Unit direction in (x, y) image coordinates (y grows downward).
DIRECTIONS = {"right": (1, 0), "left": (-1, 0), "down": (0, 1), "up": (0, -1)}


@dataclass(frozen=True)
class Track:
    """What the tracker saw: the fraction of frames holding the named colour, and the centroid's travel
    along the named direction over the clip (a fitted line), as a fraction of the frame's extent
    that way (negative: the wrong way)."""

    colour: str
    direction: str
    visible: float
    travel: float


def parse_prompt(prompt: str) -> tuple[str, str]:
    """The colour and direction a demo prompt names."""
    m = re.search(r"\b(" + "|".join(COLOURS) + r")\b.*\bmoving (" + "|".join(DIRECTIONS) + r")\b", prompt)
    if not m:
        raise ValueError(f"not a demo prompt (a <colour> square moving <direction>): {prompt!r}")
    return m.group(1), m.group(2)


# A frame shows the blob when the largest connected patch of the colour holds at least this share of
# the colour's pixels. Why: an undertrained model paints noise of every colour over the frame, and the
# centroid of scattered pixels drifts as much as a blob moves; in such noise (the demo at 20 training
# steps) the largest patch held 4-14% of the colour, in 2000-step samples with a blob 30-74%
# (docs/benchmarks.md, Demo sweep).
MIN_BLOB_SHARE = 0.25
# ... and at most this share of the frame: a frame washed in the colour is not a square of it. Measured on
# the demo's 32 x 48 samples: the trained model's largest patch covers up to 0.51 of a frame (the white
# square), a distilled student that washed the frame near-white 0.94-0.95 (docs/benchmarks.md,
# distillation), which the centroid alone had passed as a white square moving down.
MAX_FRAME_SHARE = 0.7


def _blob(mask: np.ndarray, min_pixels: int) -> tuple[float, float] | None:
    """(x, y) centroid of the mask's largest 8-connected patch, or None where it is not a blob."""
    import cv2

    n, _, stats, centroids = cv2.connectedComponentsWithStats(mask.astype(np.uint8), connectivity=8)
    if n < 2:
        return None
    largest = 1 + int(np.argmax(stats[1:, cv2.CC_STAT_AREA]))
    area = stats[largest, cv2.CC_STAT_AREA]
    if area < min_pixels or area < MIN_BLOB_SHARE * mask.sum() or area > MAX_FRAME_SHARE * mask.size:
        return None
    return float(centroids[largest][0]), float(centroids[largest][1])


def track(frames: np.ndarray, prompt: str, min_pixels: int = 3) -> Track:
    """Score frames (T, H, W, 3 uint8) against the prompt."""
    colour, direction = parse_prompt(prompt)
    rgb = frames.astype(int)
    masks = COLOURS[colour](rgb[..., 0], rgb[..., 1], rgb[..., 2])
    dx, dy = DIRECTIONS[direction]
    extent = frames.shape[2] if dx else frames.shape[1]
    seen, along = [], []
    for t, mask in enumerate(masks):
        if (blob := _blob(mask, min_pixels)) is not None:
            seen.append(t)
            along.append((dx * blob[0] + dy * blob[1]) / extent)
    # A least-squares line through the seen centroids, over the whole clip: one stray frame moves it little.
    travel = float(np.polyfit(seen, along, 1)[0] * (len(frames) - 1)) if len(seen) >= 2 else 0.0
    return Track(colour, direction, len(seen) / len(frames), travel)


def decode(path: str | Path) -> np.ndarray:
    """An MP4's frames as (T, H, W, 3) uint8."""
    import av

    with av.open(str(path)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
