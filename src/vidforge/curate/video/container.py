"""Opening a video source with PyAV: a local path or an fsspec URL, its first decodable video stream and
frame rate, why a source that does not open failed (empty, truncated, not a video), its decoder's errors
told apart from an encoder's (`undamaged`), and the length its container states (`stated_length`).
Decoding (clipping/decode.py), the recorder's own process (clipping/recorder_process.py) and transcoding
all open sources here."""

from __future__ import annotations

import os
import re
import struct
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
        if is_url(source):  # a local path goes to FFmpeg as it is
            handle = _open_bytes(source)
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


def _open_bytes(source: str):
    """A binary file of a local path or an fsspec URL (the caller closes it)."""
    if is_url(source):
        import fsspec

        return fsspec.open(source, "rb").open()
    return open(source, "rb")  # noqa: SIM115 - the caller's to close


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


class Damaged(Exception):
    """The decoder failed (its FFmpegError is the cause): told apart from an encoder's errors, which are
    PyAV's too (its OSErrors are FFmpegErrors) but no fault of the source's."""


def undamaged(frames):
    """`frames` (a container's decode), a decoder error raised as Damaged."""
    try:
        yield from frames
    except av.FFmpegError as err:
        raise Damaged from err


def frame_rate(stream) -> Fraction:
    rate = stream.average_rate or stream.guessed_rate or stream.base_rate
    if not rate or rate <= 0:
        raise ItemError("no frame rate in the stream")
    return Fraction(rate.numerator, rate.denominator)


def stated_length(source: str, container, stream) -> tuple[float, str] | None:
    """(seconds, where it is stated): how long the video stream decodes, as its container states it
    exactly, measured from its first frame; None where it states nothing exact.

    - MP4/QuickTime: the track's duration in its index (a cut-off download keeps its index when the index
      comes first, as in streamed files).
    - Matroska/WebM: the Segment's Duration in its header, only when the file ends before its Segment does
      (bytes missing at the end): the Duration spans every track, so an intact file whose audio outlasts
      its video would read as short. A file written live (no Segment size, no Duration) states nothing.
    - MPEG-TS states no length: FFmpeg reads the last timestamp in the file, so a cut file's duration is
      where it was cut (measured: a 4.75 s file cut at 30% says 1.46 s and decodes 1.50 s).
    - The rest: FFmpeg's duration may be an estimate from the bit rate.

    FFmpeg reads the Matroska Duration (`container.duration`) but not where the Segment ends, which tells
    a cut file from an intact one; so the few EBML elements on the way there are read here."""
    formats = container.format.name.split(",")
    if "mp4" in formats:
        return (float(stream.duration * stream.time_base), "its index holds") if stream.duration else None
    if "matroska" not in formats:
        return None
    try:
        head, size = _head_and_size(source)
        segment_end, duration = _matroska_segment(head)
    except (OSError, ValueError, IndexError, struct.error):
        return None
    if duration is None or segment_end is None or segment_end <= size:
        return None
    start = float(stream.start_time * stream.time_base) if stream.start_time else 0.0
    return duration - start, "its header states"


_HEAD_BYTES = 1 << 16  # muxers write the Segment's Info before its first Cluster, in its first KBs
# Matroska's EBML element IDs (matroska.org/technical/elements.html) on the way to the Segment's Duration.
_EBML, _SEGMENT, _INFO, _CLUSTER = 0x1A45DFA3, 0x18538067, 0x1549A966, 0x1F43B675
_TIMESTAMP_SCALE, _DURATION = 0x2AD7B1, 0x4489


def _head_and_size(source: str) -> tuple[bytes, int]:
    """The first _HEAD_BYTES of a local path or an fsspec URL, and its size in bytes."""
    with _open_bytes(source) as f:
        return f.read(_HEAD_BYTES), f.seek(0, os.SEEK_END)


def _matroska_segment(head: bytes) -> tuple[int | None, float | None]:
    """(where the Segment ends, in bytes from the file's start, None when its size is unknown; its
    Duration in seconds, None when not in `head`) from a Matroska file's first bytes."""
    eid, data, size = _element(head, 0)
    if eid != _EBML or size is None:
        return None, None
    eid, data, size = _element(head, data + size)
    if eid != _SEGMENT:
        return None, None
    segment_end, pos = (None if size is None else data + size), data
    while pos < len(head):  # the Segment's children, up to its first Cluster
        eid, data, size = _element(head, pos)
        if eid == _INFO and size is not None:
            return segment_end, _info_duration(head[data : data + size])
        if eid == _CLUSTER or size is None:
            break
        pos = data + size
    return segment_end, None


def _info_duration(info: bytes) -> float | None:
    """The Duration in a Segment Info element's data, in seconds (ticks of TimestampScale ns)."""
    scale, duration, pos = 1_000_000, None, 0  # TimestampScale's default: 1 ms a tick
    while pos < len(info):
        eid, data, size = _element(info, pos)
        if size is None:
            return None
        value = info[data : data + size]
        if eid == _TIMESTAMP_SCALE:
            scale = int.from_bytes(value, "big")
        elif eid == _DURATION:
            duration = struct.unpack(">f" if size == 4 else ">d", value)[0]
        pos = data + size
    return duration * scale / 1e9 if duration is not None else None


def _element(data: bytes, pos: int) -> tuple[int, int, int | None]:
    """The EBML element at `pos`: its ID, where its data starts, and its data's size (None: unknown, as a
    live writer leaves it). IndexError past `data`'s end, ValueError on bytes that are no element."""
    eid, pos, _ = _vint(data, pos)
    size, pos, width = _vint(data, pos)
    size &= (1 << (7 * width)) - 1  # without the length marker
    return eid, pos, None if size == (1 << (7 * width)) - 1 else size


def _vint(data: bytes, pos: int) -> tuple[int, int, int]:
    """An EBML variable-length integer at `pos`, its length marker kept: (value, where it ends, width)."""
    width = 9 - data[pos].bit_length()  # one leading zero bit per byte beyond the first
    if width > 8:
        raise ValueError(f"no EBML element at byte {pos}")
    if pos + width > len(data):
        raise IndexError(pos)
    return int.from_bytes(data[pos : pos + width], "big"), pos + width, width
