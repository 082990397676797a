"""Stage 1: decode a source once with PyAV (threaded) and derive, from the same downscaled frames, its
shots (stage 2), per-frame static flags (stage 5) and the thumbnails around each cut that stitching
embeds (stage 3); with `record_to`, the same decoded frames are also encoded shot by shot
(shot_recorder.py), so a clip that is a whole shot needs no second decode. Nothing proportional to the
video's length is kept, so memory stays bounded."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from fractions import Fraction
from pathlib import Path

import cv2
import numpy as np

from vidforge.curate.clipping.detection_picture import DetectionPicture
from vidforge.curate.clipping.recorder_process import RecorderProcess
from vidforge.curate.clipping.shot_recorder import ShotRecorder
from vidforge.curate.clipping.shots import ShotDetector, detection_size, make_detector
from vidforge.curate.inputs import is_url
from vidforge.curate.items import Analysis, Shot, VideoInfo
from vidforge.curate.stage import ItemError, Stage
from vidforge.curate.video.container import (
    Damaged,
    error_reason,
    frame_rate,
    open_source,
    stated_length,
    undamaged,
    video_stream,
)
from vidforge.curate.video.geometry import display_size, sample_aspect
from vidforge.curate.video.gpu_decode import gpu_frames, presentation_pts
from vidforge.profile.curation import Curation

TRUNCATION_SLACK_S, TRUNCATION_SLACK = 0.5, 0.02  # how much shorter than its stated length a file may decode


def analyse(
    source: str,
    cfg: Curation,
    record_to: Path | None = None,
    samples: int = 0,
    record_process: bool = False,
    gpu: bool = False,
) -> Analysis:
    """Decode `source` once: shots, static flags and boundary thumbnails, and with `record_to` every shot
    encoded there (with `samples` thumbnails each for the embedding), by this process or, with
    `record_process`, by a second one (recorder_process.py). On the GPU (`gpu`: decode_placement), the
    analysis decodes there and nothing is recorded: every clip is cut from the source on the CPU after
    it. ItemError for bad input."""
    detector = make_detector(cfg)
    on_gpu = gpu and not is_url(source)
    recorder = None
    if record_to is not None and not on_gpu:
        kind = RecorderProcess if record_process else ShotRecorder
        recorder = kind(source, record_to, cfg, detector.event_buffer_length, samples)
    try:
        with _opencv_in_this_thread():
            return _analyse(source, cfg, detector, recorder, on_gpu)
    except BaseException:
        if recorder is not None:
            recorder.discard()
        raise


@contextmanager
def _opencv_in_this_thread() -> Iterator[None]:
    """OpenCV's calls on the 256x144 detection pictures run in the calling thread: its thread pool (a
    thread a core) costs more in hand-offs than it saves on pictures this small (0.49 against 0.36 ms
    of CPU a picture), and its threads compete with the decoder's and x264's. Restored after."""
    before = cv2.getNumThreads()
    cv2.setNumThreads(1)
    try:
        yield
    finally:
        cv2.setNumThreads(before)


def _cpu_pictures(container, stream):
    """(pts, frame, BGR at detection size) of each decoded frame, by PyAV on the CPU."""
    picture = None
    for frame in container.decode(stream):
        picture = picture or DetectionPicture(detection_size(frame.width, frame.height))
        yield frame.pts, frame, picture(frame)


def _mean_difference(a: np.ndarray, b: np.ndarray) -> float:
    """`cv2.absdiff(a, b).mean()`, the same float: OpenCV's integer sum over the count, as numpy's exact
    float64 sum over the count (cv2.mean multiplies by the count's reciprocal instead), at a third of
    numpy's mean's cost."""
    return cv2.sumElems(cv2.absdiff(a, b))[0] / a.size


def _gpu_pictures(source: str, container, stream):
    """The same from NVDEC (video/gpu_decode.py): the first frame, decoded by PyAV, gives the rotation and
    interlacing; the others come as pictures alone (frame None)."""
    first = next(container.decode(stream), None)
    if first is None:
        return
    size = detection_size(first.width, first.height)
    for i, (pts, bgr) in enumerate(zip(presentation_pts(source), gpu_frames(source, size), strict=False)):
        yield pts, first if i == 0 else None, bgr


def _analyse(source: str, cfg: Curation, detector, recorder: ShotRecorder | None, on_gpu: bool) -> Analysis:
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
        shots = ShotDetector(detector, fps, time_base)
        keep_back = cfg.stitch_frames + 16 if cfg.stitch else 0  # detectors report cuts a few frames late
        ring: deque[tuple[int, np.ndarray]] = deque(maxlen=max(1, keep_back))
        boundary: dict[int, np.ndarray] = {}
        collect_until, pts_list, static, rotation, interlaced = -1, [], [], 0, False
        prev_gray, first_pts, index = None, None, 0
        pictures = undamaged(
            _gpu_pictures(source, container, stream) if on_gpu else _cpu_pictures(container, stream)
        )
        try:
            for raw_pts, frame, bgr in pictures:
                if raw_pts is None and recorder is not None:
                    recorder.discard()  # no timestamps to cut by: the clips are cut from the source later
                    recorder = None
                pts = raw_pts if raw_pts is not None else (pts_list[-1] + step if pts_list else 0)
                if pts_list and pts <= pts_list[-1]:
                    continue  # a repeated or out-of-order timestamp: not a new picture
                if first_pts is None:
                    first_pts, rotation = pts, int(getattr(frame, "rotation", 0) or 0) % 360
                    interlaced = bool(frame.interlaced_frame)
                    if recorder is not None:
                        recorder.begin(_info(stream, fps, rotation, interlaced), time_base)
                gray = cv2.cvtColor(bgr, cv2.COLOR_BGR2GRAY)
                static.append(
                    prev_gray is not None and _mean_difference(gray, prev_gray) < cfg.static_threshold
                )
                prev_gray = gray
                pts_list.append(pts)
                cuts = _indices(shots.feed(pts - first_pts, bgr), pts_list, first_pts)
                if recorder is not None:
                    for cut in cuts:
                        recorder.cut(cut)
                    recorder.push(index, frame)
                if keep_back:
                    ring.append((index, bgr))
                    if index < collect_until:
                        boundary[index] = bgr[..., ::-1].copy()
                    collect_until = _grab(cuts, ring, boundary, cfg.stitch_frames, collect_until)
                index += 1
        except Damaged as damaged:
            err = damaged.__cause__
            if not pts_list:
                raise ItemError(f"cannot decode: {error_reason(err)}") from None
            # Damaged part-way (a cut-off download, bad bytes): the source is one error and nothing of it
            # is kept (analyse deletes the shots recorded so far). The frames before the error may
            # already be the decoder's concealment, and the shot it ends is no shot.
            at = float((pts_list[-1] - first_pts) * time_base)
            raise ItemError(
                f"damaged after frame {len(pts_list)} ({at:.2f} s): {error_reason(err)}"
            ) from None
        if not pts_list:
            raise ItemError("no decodable video frames")
        _check_whole(source, container, stream, pts_list[-1] - first_pts + step, time_base)
        final = _indices(shots.finish(), pts_list, first_pts)
        if keep_back:
            _grab(final, ring, boundary, cfg.stitch_frames, collect_until)
        recorded = []
        if recorder is not None:
            for cut in final:
                recorder.cut(cut)
            recorded = recorder.finish()
        info = _info(stream, fps, rotation, interlaced)
    pts = np.asarray(pts_list, np.int64)
    frames = len(pts)
    deltas = np.diff(pts)
    info.frames = frames
    info.duration_s = float((pts[-1] - pts[0] + step) * time_base) if frames > 1 else float(1 / fps)
    # Variable when frame durations spread by over a tenth of a frame: timestamps rounded to a coarser
    # clock (milliseconds, then rescaled by the muxer) jitter by a tick or more at a constant rate.
    info.variable_rate = bool(frames > 2 and (deltas.max() - deltas.min()) > max(1, 0.1 * np.median(deltas)))
    index_of = {int(p - first_pts): i for i, p in enumerate(pts_list)}
    cut_frames = sorted(index_of[p] for p in shots.cuts if p in index_of and index_of[p] > 0)
    bounds = [0, *cut_frames, frames]
    scores = {index_of[p]: s for p, s in shots.cuts.items() if p in index_of}
    return Analysis(
        source=source,
        info=info,
        pts=pts,
        time_base=time_base,
        shots=[Shot(a, b, scores.get(a)) for a, b in zip(bounds[:-1], bounds[1:], strict=False) if b > a],
        static=np.asarray(static, bool),
        boundary=boundary,
        recorded=recorded,
    )


def _info(stream, fps: Fraction, rotation: int, interlaced: bool) -> VideoInfo:
    """The stream as displayed (video/geometry.py); frames and duration are filled in after the decode."""
    coded_w, coded_h = int(stream.codec_context.width), int(stream.codec_context.height)
    sar = sample_aspect(stream)
    w, h = display_size(coded_w, coded_h, sar, rotation)
    return VideoInfo(
        width=w,
        height=h,
        fps=fps,
        frames=0,
        duration_s=0.0,
        codec=stream.codec_context.name,
        rotation=rotation,
        coded_width=coded_w,
        coded_height=coded_h,
        sample_aspect=sar,
        interlaced=interlaced,
    )


def _check_whole(source: str, container, stream, decoded: int, time_base: Fraction) -> None:
    """ItemError for a file cut off part-way (a broken download or copy): with frame threads FFmpeg ends
    such a file at the cut without an error, so its decoded length is held to the length its container
    states exactly (an MP4 index, a Matroska header: video/container.py's `stated_length`, which says
    why MPEG-TS and the rest state none). A shortfall under half a second or 2% (an edit list's trim)
    passes."""
    stated = stated_length(source, container, stream)
    if stated is None:
        return
    declared, where = stated
    got = float(decoded * time_base)
    if declared - got > max(TRUNCATION_SLACK_S, TRUNCATION_SLACK * declared):
        raise ItemError(f"truncated: decodes to {got:.2f} s of the {declared:.2f} s {where}")


def _indices(cut_pts: list[int], pts_list: list[int], first_pts: int) -> list[int]:
    """Frame indices of cuts given as pts relative to the first frame."""
    if not cut_pts:
        return []  # the common case, every frame: skip converting the whole pts list
    rel = np.asarray(pts_list) - first_pts
    return [int(np.searchsorted(rel, cut)) for cut in cut_pts]


def _grab(cut_indices, ring, boundary, n, collect_until) -> int:
    """Copy the n frames before each new cut from the ring into `boundary`; collect n after it."""
    for cut_index in cut_indices:
        for i, bgr in ring:
            if cut_index - n <= i < cut_index + n and i not in boundary:
                boundary[i] = bgr[..., ::-1].copy()
        collect_until = max(collect_until, cut_index + n)
    return collect_until


class AnalyseStage(Stage[str, Analysis]):
    """Source path -> Analysis (and, with `record_to`, its shots encoded). CPU-bound (decode, x264): runs in
    worker processes."""

    name = "decode"
    kind = "process"

    def __init__(
        self,
        cfg: Curation,
        workers: int = 1,
        record_to: str | None = None,
        samples: int = 0,
        record_process: bool = False,
        gpu: bool = False,
    ):
        self.cfg, self.workers, self.record_to, self.samples = cfg, workers, record_to, samples
        self.record_process, self.gpu = record_process, gpu

    def process(self, source: str) -> Analysis:
        record_to = Path(self.record_to) if self.record_to else None
        return analyse(source, self.cfg, record_to, self.samples, self.record_process, self.gpu)
