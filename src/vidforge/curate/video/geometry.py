"""A source's picture as a person sees it: the one owner of display size and deinterlacing.

Cameras and editors leave three things between the coded picture and what is shown:
- a sample aspect ratio (anamorphic PAL/NTSC, DVD and broadcast material: 704x576 with 16:11 pixels is a
  16:9 picture). Clips are resampled to square pixels at the display aspect, the width stretched and the
  height kept (ffmpeg's `scale=iw*sar:ih`), so no line is invented or dropped vertically;
- a display rotation (phones): applied after the aspect, since the sample aspect is the coded picture's;
- interlacing (two fields a field period apart in one frame): deinterlaced with libavfilter's bwdif or
  yadif at one frame out per frame in (`mode=send_frame`), so a clip keeps its frame count and the cuts
  found on the coded frames (as PySceneDetect finds them) still hold; `curation.deinterlace=none` keeps
  the fields and the record says the clip is interlaced.

Shot detection and the static filter run on the coded frames, as PySceneDetect does, so cuts stay its own.
"""

from __future__ import annotations

from collections import deque
from fractions import Fraction
from typing import Any

import av

from vidforge.curate.items import VideoInfo
from vidforge.profile.curation import Curation


def sample_aspect(stream) -> Fraction:
    """The stream's sample aspect ratio, as ffmpeg guesses it: the container's if it has one, else the
    codec's; 1 when neither says (or says 0)."""
    for sar in (stream.sample_aspect_ratio, stream.codec_context.sample_aspect_ratio):
        if sar and sar.numerator > 0 and sar.denominator > 0:
            return Fraction(sar.numerator, sar.denominator)
    return Fraction(1)


def display_size(coded_width: int, coded_height: int, sar: Fraction, rotation: int) -> tuple[int, int]:
    """Square-pixel size as displayed: the width stretched by the sample aspect, then the rotation."""
    w, h = max(1, round(coded_width * sar)), coded_height
    return (h, w) if rotation % 180 == 90 else (w, h)


def aspect_text(sar: Fraction) -> str:
    """A sample aspect as people write it (16:11)."""
    return f"{sar.numerator}:{sar.denominator}"


def deinterlacer_for(info: VideoInfo, cfg: Curation) -> str | None:
    """The libavfilter deinterlacer a clip of this source goes through, if any."""
    return cfg.deinterlace if info.interlaced and cfg.deinterlace != "none" else None


def geometry_record(info: VideoInfo, cfg: Curation) -> dict[str, Any]:
    """What a clip's record says about the source's picture and what was done to it (`source_width` and
    `source_height` are the display size these came to)."""
    deinterlaced = deinterlacer_for(info, cfg)
    return {
        "source_coded_width": info.coded_width,
        "source_coded_height": info.coded_height,
        "source_sample_aspect": aspect_text(info.sample_aspect),
        "source_rotation": info.rotation,
        "source_interlaced": info.interlaced,
        "deinterlaced": deinterlaced,  # the filter used, or null
        "interlaced": info.interlaced and deinterlaced is None,  # the clip itself still holds fields
    }


class Deinterlacer:
    """Frames in (decode order), deinterlaced frames out, one for one, a frame late (bwdif and yadif look
    at the next field): `push` returns what is ready, `flush` the rest. Only frames flagged interlaced are
    touched (`deint=interlaced`). Timestamps are the input's, carried here: the filters halve the time
    base (to leave room for field rate), which PyAV does not report."""

    def __init__(self, method: str, first: av.VideoFrame, time_base: Fraction):
        self.graph = av.filter.Graph()
        source = self.graph.add_buffer(
            width=first.width, height=first.height, format=first.format.name, time_base=time_base
        )
        deint = self.graph.add(method, "mode=send_frame:parity=auto:deint=interlaced")
        sink = self.graph.add("buffersink")
        source.link_to(deint)
        deint.link_to(sink)
        self.graph.configure()
        self._pts: deque[int | None] = deque()

    def push(self, frame: av.VideoFrame) -> list[av.VideoFrame]:
        self._pts.append(frame.pts)
        self.graph.push(frame)
        return self._drain()

    def flush(self) -> list[av.VideoFrame]:
        self.graph.push(None)
        return self._drain()

    def _drain(self) -> list[av.VideoFrame]:
        out = []
        while self._pts:
            try:
                frame = self.graph.pull()
            except (av.BlockingIOError, av.EOFError):
                break
            frame.pts = self._pts.popleft()
            out.append(frame)
        return out
