"""Reading media into frames: videos with PyAV, images with PIL (an image is a video of one frame).

Frames are uint8 arrays (T, H, W, 3), RGB. Readers take a path or the bytes of a file (shard members)."""

from __future__ import annotations

import io
import os
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from vidforge.files import atomic_path

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")


class MediaError(ValueError):
    """A media file that cannot be decoded (missing, truncated, not a video or image)."""


def media_kind(
    name: str | os.PathLike, image_extensions: tuple[str, ...] | list[str] = IMAGE_EXTENSIONS
) -> str:
    """`image` or `video` by file extension."""
    ext = Path(name).suffix.lower().lstrip(".")
    return "image" if ext in {e.lower() for e in image_extensions} else "video"


def _source(data: bytes | str | os.PathLike):
    return io.BytesIO(data) if isinstance(data, bytes | bytearray | memoryview) else str(data)


WIDE_MODES = ("I", "I;16", "I;16B", "I;16L", "I;16N")  # Pillow's 16-bit (and 32-bit int) grey modes


def rgb(image: Any) -> Any:
    """The PIL image as RGB at 8 bits a channel, scaled from its bit depth: Pillow's convert("RGB")
    clips a 16-bit grey image (mode I;16, or I from a PNG) to 0..255 instead of scaling it, so 50% grey
    became white. A ValueError when its values leave the range its mode holds."""
    from PIL import Image

    if image.mode == "F" or image.mode in WIDE_MODES:
        values = np.asarray(image, dtype=np.float64)
        top = 65535.0 if image.mode != "F" else 1.0
        if values.size and (values.min() < 0 or values.max() > top):
            raise ValueError(
                f"{image.mode} values span {values.min():g}..{values.max():g}, outside 0..{top:g}"
            )
        image = Image.fromarray(np.rint(values * (255.0 / top)).astype(np.uint8), mode="L")
    return image.convert("RGB")


def read_image(data: bytes | str | os.PathLike) -> np.ndarray:
    """An image as (1, H, W, 3) uint8 (`rgb`: a 16-bit one scaled from its bit depth)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(_source(data)) as img:
            return np.asarray(rgb(img))[None].copy()
    except (UnidentifiedImageError, OSError, ValueError) as err:
        raise MediaError(f"not a readable image: {err}") from None


def read_video(data: bytes | str | os.PathLike, max_frames: int | None = None) -> np.ndarray:
    """A video's frames as (T, H, W, 3) uint8, at most `max_frames` from the start."""
    import av
    from av.video.reformatter import VideoReformatter

    frames, to_rgb = [], VideoReformatter()  # one swscale context, not one per frame
    try:
        with av.open(_source(data)) as container:
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            for frame in container.decode(stream):
                frames.append(to_rgb.reformat(frame, format="rgb24").to_ndarray())
                if max_frames is not None and len(frames) >= max_frames:
                    break
    except (av.FFmpegError, IndexError, OSError) as err:
        raise MediaError(f"not a readable video: {err}") from None
    if not frames:
        raise MediaError("video has no decodable frames")
    return np.stack(frames)


def read_media(data: bytes | str | os.PathLike, kind: str, max_frames: int | None = None) -> np.ndarray:
    return read_image(data) if kind == "image" else read_video(data, max_frames)


def probe(path: str | os.PathLike, kind: str) -> dict:
    """Width, height, frame count and fps without decoding every frame (images: one frame)."""
    if kind == "image":
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(path) as img:
                img.verify()
                width, height = img.size
        except (UnidentifiedImageError, OSError, ValueError) as err:
            raise MediaError(f"not a readable image: {err}") from None
        return {"width": width, "height": height, "frames": 1, "fps": 0.0}
    import av

    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            frames = stream.frames
            if not frames:  # containers without a frame count: count packets
                frames = sum(1 for p in container.demux(stream) if p.size)
            fps = float(stream.average_rate or 0)
            return {
                "width": stream.codec_context.width,
                "height": stream.codec_context.height,
                "frames": int(frames),
                "fps": fps,
            }
    except (av.FFmpegError, IndexError, OSError) as err:
        raise MediaError(f"not a readable video: {err}") from None


def write_video(
    path: str | os.PathLike,
    frames: np.ndarray,
    fps: float = 8.0,
    codec: str = "libx264",
    lossless: bool = False,
) -> None:
    """Write (T, H, W, 3) uint8 frames as an mp4 (tests, the decode side of `infer`). Even sizes for yuv420."""
    import av

    with atomic_path(path) as tmp, av.open(str(tmp), "w") as container:
        stream = container.add_stream(codec, rate=Fraction(fps).limit_denominator(1000))
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "yuv444p" if lossless else "yuv420p"
        if lossless:
            stream.options = {"qp": "0", "preset": "ultrafast"}
        for array in frames:
            for packet in stream.encode(
                av.VideoFrame.from_ndarray(np.ascontiguousarray(array), format="rgb24")
            ):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
