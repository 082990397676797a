"""Thumbnails for the review page: a strip of a few frames of each clip or sample, small JPEGs that a page
of 10,000 clips can list without loading a single video (the video itself loads when it is played)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image

from vidforge.data.manifest import atomic_path
from vidforge.sampling.writers import frame_picks, frame_strip

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".webp", ".bmp"}


def _frames(media: Path, columns: int) -> list[np.ndarray]:
    if media.suffix.lower() in IMAGE_SUFFIXES:
        with Image.open(media) as image:
            return [np.asarray(image.convert("RGB"))]
    import av

    with av.open(str(media)) as container:
        stream = container.streams.video[0]
        count = stream.frames
        if count <= 0:  # a container without a frame count: decode it all (clips are short)
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
            return [frames[i] for i in frame_picks(len(frames), columns)] if frames else []
        wanted = set(frame_picks(count, columns).tolist())
        frames = []
        for i, frame in enumerate(container.decode(stream)):
            if i in wanted:
                frames.append(frame.to_ndarray(format="rgb24"))
            if i >= max(wanted):
                break
        return frames


def make_thumb(media: Path, out: Path, height: int = 64, columns: int = 4) -> bool:
    """Write a JPEG strip of `columns` frames, each `height` pixels high, for `media` (a video or an image).
    Reuses `out` when it is newer than the media. False when the media is missing or does not decode."""
    try:
        if out.is_file() and out.stat().st_mtime >= media.stat().st_mtime:
            return True
        frames = _frames(media, columns)
    except (
        OSError,
        ValueError,
        IndexError,
    ):  # missing, unreadable or undecodable media (av errors are OSError)
        return False
    if not frames:
        return False
    h, w = frames[0].shape[:2]
    size = (max(1, round(w * height / h)), height)
    small = [np.asarray(Image.fromarray(f).resize(size, Image.BILINEAR)) for f in frames]
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out) as tmp:
        Image.fromarray(frame_strip(small)).save(tmp, format="JPEG", quality=82)
    return True


def make_thumbs(
    jobs: Sequence[tuple[Path, Path]], progress: Callable[[int, int], None] | None = None
) -> list[bool]:
    """`make_thumb` for each (media, thumb) pair on a thread per core (PyAV decodes outside the GIL)."""
    done = []
    with ThreadPoolExecutor(max_workers=max(1, len(os.sched_getaffinity(0)))) as pool:
        for ok in pool.map(lambda job: make_thumb(*job), jobs):
            done.append(ok)
            if progress is not None:
                progress(len(done), len(jobs))
    return done
