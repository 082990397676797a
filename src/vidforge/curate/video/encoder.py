"""H.264 (libx264, yuv420p) MP4 encoding of a run of a source's frames, in display order, through PyAV.

Used by both ways a clip gets made: cut from the source by plan (clipping/transcode.py) and recorded shot by shot
while the source is decoded for analysis (clipping/shot_recorder.py). The clip's length need not be known up
front: frames go in as they are decoded."""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
from av.video.reformatter import VideoReformatter

from vidforge.curate.items import VideoInfo
from vidforge.curate.video.geometry import Deinterlacer, deinterlacer_for
from vidforge.profile.curation import Curation

SAMPLE_SIDE = 256  # longest side of the frames kept for the embedding model (it resizes them anyway)


def output_size(width: int, height: int, max_resolution: int) -> tuple[int, int]:
    """Display size capped at max_resolution on the longest side, rounded to even numbers (yuv420p)."""
    scale = min(1.0, max_resolution / max(width, height)) if max_resolution else 1.0
    w, h = max(2, int(width * scale) // 2 * 2), max(2, int(height * scale) // 2 * 2)
    return w, h


def sample_indices(frames: int, k: int) -> list[int]:
    """K frame indices spread evenly over a clip (centres of K equal parts)."""
    k = min(k, frames)
    return sorted({int((i + 0.5) * frames / k) for i in range(k)})


class ClipEncoder:
    """Frames of one clip in, an MP4 at `path` out (the caller picks a temporary name and renames it).

    Deinterlaces, applies the source's display rotation and sample aspect (geometry.py), caps the size at
    `curation.max_resolution` and, with `curation.fps`, resamples by dropping or repeating frames so the
    clip keeps its duration. `on_frame` sees each source frame as converted for the clip (yuv420p at the
    clip's size), in order; with a deinterlacer that is a frame after `add` (and the last at `close`)."""

    def __init__(
        self,
        path: Path,
        info: VideoInfo,
        time_base: Fraction,
        first_pts: int,
        cfg: Curation,
        on_frame: Callable[[av.VideoFrame], None] | None = None,
    ):
        self.path, self.info, self.time_base, self.first_pts = path, info, time_base, first_pts
        self.on_frame = on_frame
        self.deinterlace = deinterlacer_for(info, cfg)
        self._deinterlacer: Deinterlacer | None = None
        self.resample = cfg.fps is not None
        self.width, self.height = output_size(info.width, info.height, cfg.max_resolution)
        self.rate = Fraction(cfg.fps).limit_denominator(1001) if cfg.fps else Fraction(info.fps)
        # Keep our own copy: the muxer replaces the stream's time base when it writes the header.
        self.frame_tb = Fraction(self.rate.denominator, self.rate.numerator)
        # One swscale context per conversion, reused for every frame: PyAV's frame.reformat() and
        # to_ndarray(format=...) build a new one per call, which costs more than the conversion (~4 ms a
        # 640x360 frame). Separate ones, since a context rebuilds whenever its sizes or formats change.
        self._to_rgb, self._scale, self._thumbs = VideoReformatter(), VideoReformatter(), VideoReformatter()
        self.taken = self.written = 0
        self.output = av.open(str(path), "w", format="mp4")
        enc = self.output.add_stream("libx264", rate=self.rate)
        enc.width, enc.height, enc.pix_fmt = self.width, self.height, "yuv420p"
        enc.time_base = self.frame_tb
        enc.options = {"crf": str(cfg.crf), "preset": cfg.preset}
        if cfg.encoder_threads:
            enc.codec_context.thread_count = cfg.encoder_threads
        self.enc = enc

    def add(self, frame: av.VideoFrame) -> None:
        """Encode one source frame (a frame later when deinterlacing)."""
        self.taken += 1
        if self.deinterlace is None:
            self._encode(frame)
            return
        if self._deinterlacer is None:
            self._deinterlacer = Deinterlacer(self.deinterlace, frame, self.time_base)
        for done in self._deinterlacer.push(frame):
            self._encode(done)

    def _encode(self, frame: av.VideoFrame) -> None:
        pts = frame.pts
        if self.info.rotation:
            rgb = self._to_rgb.reformat(frame, format="rgb24").to_ndarray()
            rgb = np.ascontiguousarray(np.rot90(rgb, k=(self.info.rotation // 90) % 4))
            frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
        out = self._scale.reformat(frame, width=self.width, height=self.height, format="yuv420p")
        t = (pts - self.first_pts) * self.time_base
        repeats = _repeats(t, 1 / Fraction(self.info.fps), self.rate, self.written) if self.resample else 1
        for _ in range(repeats):
            copy = out if repeats == 1 else out.reformat()
            copy.pts, copy.time_base = self.written, self.frame_tb
            self.output.mux(self.enc.encode(copy))
            self.written += 1
        if self.on_frame is not None:
            self.on_frame(out)

    def thumbnail(self, converted: av.VideoFrame) -> np.ndarray:
        """A frame `on_frame` saw, as RGB with SAMPLE_SIDE on its longest side (for the embedding model)."""
        sw, sh = output_size(self.width, self.height, SAMPLE_SIDE)
        return self._thumbs.reformat(converted, width=sw, height=sh, format="rgb24").to_ndarray()

    def close(self) -> None:
        """Flush the deinterlacer and the encoder and finish the file."""
        if self._deinterlacer is not None:
            for done in self._deinterlacer.flush():
                self._encode(done)
        self.output.mux(self.enc.encode(None))
        self.output.close()

    def abort(self) -> None:
        try:
            self.output.close()
        except Exception:  # noqa: BLE001 - already failing; the caller deletes the file either way
            pass


def _repeats(t: Fraction, shown: Fraction, rate: Fraction, written: int) -> int:
    """How many output frames a source frame on screen from time t for `shown` seconds adds: output frame
    k (at time k / rate) is the source frame on screen at that time. Frames are dropped or repeated, and
    the clip keeps its duration at the new rate. Exact (fractions), so frames on a slot boundary land
    on the same side on every platform."""
    due = math.ceil((t + shown) * rate)
    return max(0, due - written)
