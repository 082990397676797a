"""Writing sampled videos: H.264 MP4 through PyAV, and a PNG contact sheet to see a batch at a glance."""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
from PIL import Image, ImageDraw

from vidforge.data.manifest import atomic_path


def write_mp4(path: str | Path, frames: np.ndarray, fps: int, crf: int = 18) -> None:
    """frames: (T, H, W, 3) uint8 RGB. Odd sizes are padded by one pixel (yuv420p needs even sizes)."""
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise ValueError(f"frames must be (T, H, W, 3) uint8, got {frames.dtype} {frames.shape}")
    t, h, w, _ = frames.shape
    frames = np.pad(frames, ((0, 0), (0, h % 2), (0, w % 2), (0, 0)), mode="edge")
    with atomic_path(path) as tmp, av.open(str(tmp), mode="w") as container:
        stream = container.add_stream("libx264", rate=Fraction(fps))
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": str(crf), "preset": "medium"}
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def frame_picks(count: int, columns: int) -> np.ndarray:
    """Indices of `columns` frames evenly spaced over `count` (fewer if the video is shorter)."""
    return np.linspace(0, count - 1, num=min(columns, count)).round().astype(int)


def frame_strip(frames: Sequence[np.ndarray], gap: int = 2) -> np.ndarray:
    """Frames (H, W, 3) side by side with a white `gap`-pixel line between them, so that where one frame
    ends is visible even when neighbouring frames are alike."""
    height = frames[0].shape[0]
    line = np.full((height, gap, 3), 255, np.uint8)
    parts = [frames[0]]
    for frame in frames[1:]:
        parts += [line, frame]
    return np.concatenate(parts, axis=1)


def contact_sheet(
    path: str | Path,
    videos: Sequence[np.ndarray],
    labels: Sequence[str],
    columns: int = 8,
    scale: int = 2,
    note: str = "",
) -> None:
    """One row per video: `columns` frames evenly spaced in time, upscaled `scale`x (nearest), with the
    prompt written above the row and `note` (e.g. the sampler settings) after it."""
    if not videos:
        raise ValueError("contact_sheet needs at least one video")
    label_h = 14
    rows = []
    for video, label in zip(videos, labels, strict=True):
        picks = frame_picks(len(video), columns)
        big = [video[i].repeat(scale, axis=0).repeat(scale, axis=1) for i in picks]
        strip = frame_strip(big)
        label = f"{label}  [{note}]" if note else label
        canvas = Image.new("RGB", (strip.shape[1], strip.shape[0] + label_h), "white")
        canvas.paste(Image.fromarray(strip), (0, label_h))
        ImageDraw.Draw(canvas).text((2, 1), label[:160], fill="black")
        rows.append(canvas)
    width = max(r.width for r in rows)
    sheet = Image.new("RGB", (width, sum(r.height for r in rows)), "white")
    y = 0
    for row in rows:
        sheet.paste(row, (0, y))
        y += row.height
    with atomic_path(path) as tmp:
        sheet.save(tmp, format="PNG")
