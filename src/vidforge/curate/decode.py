"""Stage 1: decode a source once with PyAV (threaded) and derive, from the same downscaled frames, its
shots (stage 2), per-frame static flags (stage 5) and the thumbnails around each cut that stitching
embeds (stage 3). Nothing proportional to the video's pixels is kept, so memory stays bounded."""

from __future__ import annotations

from collections import deque
from contextlib import contextmanager
from fractions import Fraction

import av
import cv2
import numpy as np

from vidforge.curate.inputs import is_url
from vidforge.curate.items import Analysis, Shot, VideoInfo
from vidforge.curate.shots import ShotDetector, detection_size, downscale
from vidforge.curate.stage import ItemError, Stage
from vidforge.profile.curation import Curation


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
            raise ItemError(f"cannot open: {_reason(err)}") from None
        try:
            yield container
        finally:
            container.close()
    finally:
        if handle is not None:
            handle.close()


def _reason(err: Exception) -> str:
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    return text.split(": '", 1)[0] if "Errno" in text else text


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


def analyse(source: str, cfg: Curation) -> Analysis:
    """Decode `source` once: shots, static flags and boundary thumbnails. ItemError for bad input."""
    with open_source(source) as container:
        stream = video_stream(container)
        stream.thread_type = "AUTO"
        if cfg.decode_threads:
            stream.codec_context.thread_count = cfg.decode_threads
        fps, time_base = (
            frame_rate(stream),
            Fraction(stream.time_base.numerator, stream.time_base.denominator),
        )
        step = max(1, round(1 / (fps * time_base)))  # pts ticks per frame, for frames without a pts
        size = None
        detector = ShotDetector(cfg, fps, time_base)
        keep_back = cfg.stitch_frames + 16 if cfg.stitch else 0  # detectors report cuts a few frames late
        ring: deque[tuple[int, np.ndarray]] = deque(maxlen=max(1, keep_back))
        boundary: dict[int, np.ndarray] = {}
        collect_until, pts_list, static, rotation = -1, [], [], 0
        prev_gray, first_pts, index = None, None, 0
        try:
            for frame in container.decode(stream):
                pts = frame.pts if frame.pts is not None else (pts_list[-1] + step if pts_list else 0)
                if pts_list and pts <= pts_list[-1]:
                    continue  # a repeated or out-of-order timestamp: not a new picture
                if first_pts is None:
                    first_pts, rotation = pts, int(getattr(frame, "rotation", 0) or 0) % 360
                    size = detection_size(frame.width, frame.height)
                bgr = downscale(frame.to_ndarray(format="bgr24"), size)
                gray = cv2.cvtColor(bgr, cv2.COLOR_BGR2GRAY)
                static.append(
                    prev_gray is not None and cv2.absdiff(gray, prev_gray).mean() < cfg.static_threshold
                )
                prev_gray = gray
                pts_list.append(pts)
                cuts = detector.feed(pts - first_pts, bgr)
                if keep_back:
                    ring.append((index, bgr))
                    if index < collect_until:
                        boundary[index] = bgr[..., ::-1].copy()
                    collect_until = _grab(
                        cuts, pts_list, first_pts, ring, boundary, cfg.stitch_frames, collect_until
                    )
                index += 1
        except av.FFmpegError as err:
            if not pts_list:
                raise ItemError(f"cannot decode: {_reason(err)}") from None
            # A damaged tail: keep the frames decoded so far (recorded as a shorter source).
        if not pts_list:
            raise ItemError("no decodable video frames")
        final = detector.finish()
        if keep_back:
            _grab(final, pts_list, first_pts, ring, boundary, cfg.stitch_frames, collect_until)
        codec = stream.codec_context.name
    pts = np.asarray(pts_list, np.int64)
    frames = len(pts)
    duration = float((pts[-1] - pts[0] + step) * time_base) if frames > 1 else float(1 / fps)
    deltas = np.diff(pts)
    vfr = bool(frames > 2 and (deltas.max() - deltas.min()) > 1)
    w, h = int(stream.codec_context.width), int(stream.codec_context.height)
    if rotation in (90, 270):
        w, h = h, w
    info = VideoInfo(
        width=w,
        height=h,
        fps=fps,
        frames=frames,
        duration_s=duration,
        codec=codec,
        rotation=rotation,
        variable_rate=vfr,
    )
    index_of = {int(p - first_pts): i for i, p in enumerate(pts_list)}
    cut_frames = sorted(index_of[p] for p in detector.cuts if p in index_of and index_of[p] > 0)
    bounds = [0, *cut_frames, frames]
    scores = {index_of[p]: s for p, s in detector.cuts.items() if p in index_of}
    shots = [Shot(a, b, scores.get(a)) for a, b in zip(bounds[:-1], bounds[1:], strict=False) if b > a]
    return Analysis(
        source=source,
        info=info,
        pts=pts,
        time_base=time_base,
        shots=shots,
        static=np.asarray(static, bool),
        boundary=boundary,
    )


def _grab(cut_pts, pts_list, first_pts, ring, boundary, n, collect_until) -> int:
    """Copy the n frames before each new cut from the ring into `boundary`; collect n after it."""
    for cut in cut_pts:
        cut_index = int(np.searchsorted(np.asarray(pts_list) - first_pts, cut))
        for i, bgr in ring:
            if cut_index - n <= i < cut_index + n and i not in boundary:
                boundary[i] = bgr[..., ::-1].copy()
        collect_until = max(collect_until, cut_index + n)
    return collect_until


class AnalyseStage(Stage):
    """Source path -> Analysis. CPU-bound (decode): runs in worker processes."""

    name = "decode"
    kind = "process"

    def __init__(self, cfg: Curation, workers: int = 1):
        self.cfg, self.workers = cfg, workers

    def process(self, source: str) -> Analysis:
        return analyse(source, self.cfg)
