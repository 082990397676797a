"""Resolution, aspect and length buckets: where a clip goes, and how it is resized and cropped there."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def frame_bucket(frames: int, frame_buckets: Sequence[int]) -> int | None:
    """The longest bucket of 4k+1 frames that the clip fills; None when it is shorter than every bucket."""
    fitting = [n for n in frame_buckets if n <= frames]
    return max(fitting) if fitting else None


def resolution_bucket(height: int, width: int, buckets: Sequence[tuple[int, int]]) -> tuple[int, int]:
    """The bucket nearest in log-aspect ratio; among equally near ones the largest not above the clip's
    area (upscaling is worse than a smaller bucket), else the smallest."""
    aspect = math.log(width / height)
    distances = [abs(math.log(w / h) - aspect) for h, w in buckets]
    best = min(distances)
    near = [b for b, d in zip(buckets, distances, strict=True) if d - best < 1e-6]
    fitting = [b for b in near if b[0] * b[1] <= height * width]
    return max(fitting, key=lambda b: b[0] * b[1]) if fitting else min(near, key=lambda b: b[0] * b[1])


def bucket_label(height: int, width: int, frames: int) -> str:
    """A file-name-safe label of a bucket, e.g. `256x256x17`."""
    return f"{height}x{width}x{frames}"


def resize_crop(frames: np.ndarray, height: int, width: int) -> np.ndarray:
    """Scale (T, H, W, 3) uint8 frames to cover (height, width) keeping the aspect, then centre-crop.
    Uses torch's antialiased bilinear resize (one call for all frames)."""
    import torch
    import torch.nn.functional as F

    t, h, w, _ = frames.shape
    if (h, w) == (height, width):
        return frames
    scale = max(height / h, width / w)
    new_h, new_w = max(height, round(h * scale)), max(width, round(w * scale))
    x = torch.from_numpy(frames).permute(0, 3, 1, 2).float()
    x = F.interpolate(x, size=(new_h, new_w), mode="bilinear", antialias=True, align_corners=False)
    top, left = (new_h - height) // 2, (new_w - width) // 2
    x = x[:, :, top : top + height, left : left + width]
    return x.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous().numpy()
