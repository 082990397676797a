"""Stage 4: duration policy. Trim each end, drop what is too short, split what is too long into the
fewest even pieces that fit."""

from __future__ import annotations

import math


def apply_duration(start: int, end: int, fps: float, min_s: float, max_s: float, trim_s: float = 0.0):
    """The spans [a, b) to keep from the shot [start, end), and a reason when nothing is kept."""
    trim = round(trim_s * fps)
    start, end = start + trim, end - trim
    length = end - start
    min_frames = math.ceil(min_s * fps - 1e-9)
    if length <= 0 or length < min_frames:
        seconds = max(0, length) / fps
        return [], f"{seconds:.2f} s after trimming is shorter than curation.min_seconds={min_s}"
    max_frames = max(1, math.floor(max_s * fps + 1e-9))
    pieces = math.ceil(length / max_frames)
    cuts = [start + round(k * length / pieces) for k in range(pieces + 1)]
    return list(zip(cuts[:-1], cuts[1:], strict=False)), None
