"""Stage 6: cut each clip frame-accurately and encode it as H.264 (libx264, yuv420p) through PyAV.

Never a stream copy: the source is seeked to the keyframe before the clip, decoded, and exactly the
clip's frames (matched by timestamp) are re-encoded, so a clip holds its frames and none of the
neighbouring shot's. The same pass samples K frames for the clip embedding, so embedding costs no
extra decode."""

from __future__ import annotations

import math
import os
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from vidforge.curate.decode import open_source, video_stream
from vidforge.curate.items import ClipPlan, ClipResult
from vidforge.curate.stage import ItemError, Stage
from vidforge.data.manifest import atomic_path
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


def _rotate(frame: av.VideoFrame, rotation: int) -> av.VideoFrame:
    """Apply the display rotation (degrees counter-clockwise, as PyAV reports it) to the pixels."""
    rgb = frame.to_ndarray(format="rgb24")
    rgb = np.ascontiguousarray(np.rot90(rgb, k=(rotation // 90) % 4))
    return av.VideoFrame.from_ndarray(rgb, format="rgb24")


def transcode(plan: ClipPlan, out_path: Path, cfg: Curation, samples: int = 0) -> ClipResult:
    info = plan.info
    want = plan.end - plan.start
    first_pts, last_pts = int(plan.pts[0]), int(plan.pts[-1])
    wanted = set(int(p) for p in plan.pts)
    width, height = output_size(info.width, info.height, cfg.max_resolution)
    in_rate = Fraction(info.fps)
    rate = Fraction(cfg.fps).limit_denominator(1001) if cfg.fps else in_rate
    picks = set(sample_indices(want, samples)) if samples else set()
    kept_samples: list[np.ndarray] = []
    written = 0
    with open_source(plan.source) as container, atomic_path(out_path) as tmp:
        stream = video_stream(container)
        stream.thread_type = "AUTO"
        with av.open(str(tmp), "w", format="mp4") as output:
            enc = output.add_stream("libx264", rate=rate)
            enc.width, enc.height, enc.pix_fmt = width, height, "yuv420p"
            # Keep our own copy: the muxer replaces the stream's time base when it writes the header.
            frame_tb = Fraction(rate.denominator, rate.numerator)
            enc.time_base = frame_tb
            enc.options = {"crf": str(cfg.crf), "preset": cfg.preset}
            if cfg.encoder_threads:
                enc.codec_context.thread_count = cfg.encoder_threads
            taken = 0
            for frame in _frames_from(container, stream, first_pts):
                pts = frame.pts
                if pts is None or pts < first_pts or pts not in wanted:
                    if pts is not None and pts > last_pts:
                        break
                    continue
                if info.rotation:
                    frame = _rotate(frame, info.rotation)
                out = frame.reformat(width=width, height=height, format="yuv420p")
                if taken in picks:
                    sw, sh = output_size(width, height, SAMPLE_SIDE)
                    kept_samples.append(out.reformat(width=sw, height=sh, format="rgb24").to_ndarray())
                t = float((pts - first_pts) * plan.time_base)
                repeats = _repeats(t, rate, written) if cfg.fps else 1
                for _ in range(repeats):
                    copy = out if repeats == 1 else out.reformat()
                    copy.pts, copy.time_base = written, frame_tb
                    output.mux(enc.encode(copy))
                    written += 1
                taken += 1
                if taken == want:
                    break
            output.mux(enc.encode(None))
        if taken != want:
            raise ItemError(f"decoded {taken} of the clip's {want} frames (source changed or damaged?)")
    return ClipResult(plan=plan, path=str(out_path), frames=written, width=width, height=height, fps=float(rate),
                      samples=np.stack(kept_samples) if kept_samples else None)


def _repeats(t: float, rate: Fraction, written: int) -> int:
    """How many output frames (at `rate`) a source frame shown from time t covers: resampling by
    dropping or repeating frames, so the clip keeps its duration at the new rate."""
    due = math.floor(t * rate + 0.5) + 1
    return max(0, due - written)


def _frames_from(container, stream, first_pts: int):
    """Decoded frames from the keyframe at or before `first_pts`. If the seek overshoots (a broken
    index), decode from the start instead."""
    try:
        container.seek(first_pts, stream=stream, backward=True, any_frame=False)
    except av.FFmpegError:
        container.seek(0)
    frames = container.decode(stream)
    try:
        head = next(frames)
    except StopIteration:
        return
    except av.FFmpegError as err:
        raise ItemError(f"cannot decode after seeking: {err}") from None
    if head.pts is not None and head.pts > first_pts:
        container.seek(stream.start_time or 0, stream=stream, backward=True, any_frame=False)
        frames = container.decode(stream)
    else:
        yield head
    yield from frames


class TranscodeStage(Stage):
    """ClipPlan -> ClipResult (rejected plans pass through). CPU-bound (decode + x264): worker processes."""

    name = "transcode"
    kind = "process"

    def __init__(self, cfg: Curation, clips_dir: str | os.PathLike, samples: int, workers: int = 1):
        self.cfg, self.clips_dir, self.samples, self.workers = cfg, str(clips_dir), samples, workers

    def setup(self) -> None:
        try:
            av.codec.Codec("libx264", "w")
        except Exception:  # noqa: BLE001 - any failure means no encoder
            from vidforge.errors import UserInputError

            raise UserInputError("this PyAV build has no libx264 encoder; install av wheels from PyPI") from None
        Path(self.clips_dir).mkdir(parents=True, exist_ok=True)

    def process(self, plan: ClipPlan):
        if plan.rejected is not None:
            return plan
        return transcode(plan, Path(self.clips_dir) / f"{plan.clip_id}.mp4", self.cfg, self.samples)
