"""Opening a video source with PyAV: a local path or an fsspec URL, its first decodable video stream and
frame rate, and why a source that does not open failed (empty, truncated, not a video). Decoding
(clipping/decode.py), the recorder's own process (clipping/recorder_process.py) and transcoding all open sources here."""

from __future__ import annotations

import re
from contextlib import contextmanager
from fractions import Fraction
from pathlib import Path

import av

from vidforge.curate.inputs import is_url
from vidforge.curate.stage import ItemError


@contextmanager
def open_source(source: str):
    """An open PyAV container for a local path or an fsspec URL; ItemError when it cannot be opened."""
    handle = None
    try:
        if is_url(source):
            import fsspec

            handle = fsspec.open(source, "rb").open()
        try:
            container = av.open(handle if handle is not None else source, "r")
        except (av.FFmpegError, OSError, ValueError) as err:
            raise ItemError(f"cannot open: {_open_failure(source, err)}") from None
        try:
            yield container
        finally:
            container.close()
    finally:
        if handle is not None:
            handle.close()


# The first bytes of the containers a video comes in: a file that starts like one but does not open is
# truncated or corrupt; one that starts like none is not a video at all (ffmpeg says "Invalid data" to both).
_SIGNATURES = (
    (4, (b"ftyp", b"moov", b"mdat", b"free", b"wide", b"skip"), "MP4/QuickTime"),
    (0, (b"\x1a\x45\xdf\xa3",), "Matroska/WebM"),
    (0, (b"RIFF",), "AVI"),
    (0, (b"FLV",), "FLV"),
    (0, (b"OggS",), "Ogg"),
    (0, (b"\x00\x00\x01\xba",), "MPEG-PS"),
    (0, (b"\x30\x26\xb2\x75",), "ASF/WMV"),
)


def _open_failure(source: str, err: Exception) -> str:
    """Why a source did not open, told apart: an empty file, a truncated one, or not a video at all."""
    reason = error_reason(err)
    if is_url(source):
        return reason
    try:
        size = Path(source).stat().st_size
        with open(source, "rb") as f:
            head = f.read(16)
    except OSError:
        return reason
    if size == 0:
        return "empty file (0 bytes)"
    for offset, magics, kind in _SIGNATURES:
        if head[offset : offset + 4].startswith(magics):
            return f"truncated or corrupt {kind} file ({size} bytes; {reason})"
    if head[:1] == b"\x47" and size >= 188:  # MPEG-TS: sync byte every 188 bytes
        return f"truncated or corrupt MPEG-TS file ({size} bytes; {reason})"
    return f"not a video file: its first bytes match no container format ({reason})"


def error_reason(err: Exception) -> str:
    """An error's first line; of PyAV's, FFmpeg's message alone (without `[Errno N]` and the call)."""
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    if "Errno" not in text:
        return text
    return re.sub(r"^\[Errno -?\d+\] ", "", text.split(": '", 1)[0])


def video_stream(container):
    """The first video stream, checked to be decodable."""
    if not container.streams.video:
        kinds = sorted({s.type for s in container.streams}) or ["none"]
        raise ItemError(f"no video stream (streams: {', '.join(kinds)})")
    stream = container.streams.video[0]
    ctx = stream.codec_context
    if ctx is None or ctx.name in (None, "none") or not getattr(ctx.codec, "is_decoder", True):
        tag = getattr(stream, "codec_tag", "") or "unknown"
        raise ItemError(f"unsupported codec (no decoder for {tag!r})")
    return stream


def frame_rate(stream) -> Fraction:
    rate = stream.average_rate or stream.guessed_rate or stream.base_rate
    if not rate or rate <= 0:
        raise ItemError("no frame rate in the stream")
    return Fraction(rate.numerator, rate.denominator)
