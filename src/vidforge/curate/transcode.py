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


class _ClipWriter:
    """Encodes one clip: frames in, H.264 MP4 out under a temporary name, renamed when complete."""

    def __init__(self, plan: ClipPlan, out_path: Path, cfg: Curation, samples: int):
        info = plan.info
        self.plan, self.out_path, self.cfg = plan, out_path, cfg
        self.want, self.wanted = plan.end - plan.start, {int(p) for p in plan.pts}
        self.first_pts, self.last_pts = int(plan.pts[0]), int(plan.pts[-1])
        self.width, self.height = output_size(info.width, info.height, cfg.max_resolution)
        self.rate = Fraction(cfg.fps).limit_denominator(1001) if cfg.fps else Fraction(info.fps)
        # Keep our own copy: the muxer replaces the stream's time base when it writes the header.
        self.frame_tb = Fraction(self.rate.denominator, self.rate.numerator)
        self.picks = set(sample_indices(self.want, samples)) if samples else set()
        self.samples: list[np.ndarray] = []
        self.taken = self.written = 0
        self._atomic = atomic_path(out_path)
        tmp = self._atomic.__enter__()
        self.output = av.open(str(tmp), "w", format="mp4")
        enc = self.output.add_stream("libx264", rate=self.rate)
        enc.width, enc.height, enc.pix_fmt = self.width, self.height, "yuv420p"
        enc.time_base = self.frame_tb
        enc.options = {"crf": str(cfg.crf), "preset": cfg.preset}
        if cfg.encoder_threads:
            enc.codec_context.thread_count = cfg.encoder_threads
        self.enc = enc

    @property
    def complete(self) -> bool:
        return self.taken == self.want

    def add(self, frame: av.VideoFrame) -> None:
        pts, rotation = frame.pts, self.plan.info.rotation
        if rotation:
            frame = _rotate(frame, rotation)
        out = frame.reformat(width=self.width, height=self.height, format="yuv420p")
        if self.taken in self.picks:
            sw, sh = output_size(self.width, self.height, SAMPLE_SIDE)
            self.samples.append(out.reformat(width=sw, height=sh, format="rgb24").to_ndarray())
        t = float((pts - self.first_pts) * self.plan.time_base)
        repeats = _repeats(t, self.rate, self.written) if self.cfg.fps else 1
        for _ in range(repeats):
            copy = out if repeats == 1 else out.reformat()
            copy.pts, copy.time_base = self.written, self.frame_tb
            self.output.mux(self.enc.encode(copy))
            self.written += 1
        self.taken += 1

    def finish(self) -> ClipResult:
        self.output.mux(self.enc.encode(None))
        self.output.close()
        if not self.complete:
            self.abort()
            raise ItemError(
                f"decoded {self.taken} of the clip's {self.want} frames (source changed or damaged?)"
            )
        self._atomic.__exit__(None, None, None)
        return ClipResult(
            plan=self.plan,
            path=str(self.out_path),
            frames=self.written,
            width=self.width,
            height=self.height,
            fps=float(self.rate),
            samples=np.stack(self.samples) if self.samples else None,
        )

    def abort(self) -> None:
        try:
            self.output.close()
        except Exception:  # noqa: BLE001 - already failing; the temporary file goes either way
            pass
        self._atomic.__exit__(ItemError, ItemError("aborted"), None)


def transcode_source(plans: list[ClipPlan], clips_dir: Path, cfg: Curation, samples: int = 0) -> list:
    """Cut every kept clip of one source in a single decode pass (seeking once, to the first clip).
    Per-clip seeks would decode from the previous keyframe again for every clip: with long GOPs that
    costs more than the encode. Rejected plans and clips that fail come back as they are / as errors."""
    kept = sorted((p for p in plans if p.rejected is None), key=lambda p: p.start)
    results: list = [p for p in plans if p.rejected is not None]
    if not kept:
        return results
    source = kept[0].source
    with open_source(source) as container:
        stream = video_stream(container)
        stream.thread_type = "AUTO"
        queue = list(kept)
        writer: _ClipWriter | None = None
        try:
            for frame in _frames_from(container, stream, int(queue[0].pts[0])):
                pts = frame.pts
                if pts is None:
                    continue
                if writer is None:
                    if pts < int(queue[0].pts[0]):
                        continue
                    writer = _ClipWriter(queue[0], clips_dir / f"{queue[0].clip_id}.mp4", cfg, samples)
                if pts in writer.wanted:
                    writer.add(frame)
                if writer.complete or pts >= writer.last_pts:
                    results.append(writer.finish())
                    writer = None
                    queue.pop(0)
                    if not queue:
                        break
            if writer is not None:
                results.append(writer.finish())
                queue.pop(0)
        except BaseException:
            if writer is not None:
                writer.abort()
            raise
    for plan in queue:  # the source ended before these clips: recorded as errors, not silently lost
        raise ItemError(f"source ended before clip {plan.start}:{plan.end}")
    return results


def transcode(plan: ClipPlan, out_path: Path, cfg: Curation, samples: int = 0) -> ClipResult:
    """One clip on its own (seeks to it)."""
    out_path.parent.mkdir(parents=True, exist_ok=True)
    (result,) = transcode_source([plan], out_path.parent, cfg, samples)
    if result.path != str(out_path):
        os.replace(result.path, out_path)
        result.path = str(out_path)
    return result


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
    """[ClipPlan] of one source -> [ClipResult | rejected ClipPlan], in one decode pass. CPU-bound
    (decode + x264): worker processes, parallel across sources."""

    name = "transcode"
    kind = "process"

    def __init__(self, cfg: Curation, clips_dir: str | os.PathLike, samples: int, workers: int = 1):
        self.cfg, self.clips_dir, self.samples, self.workers = cfg, str(clips_dir), samples, workers

    def setup(self) -> None:
        try:
            av.codec.Codec("libx264", "w")
        except Exception:  # noqa: BLE001 - any failure means no encoder
            from vidforge.errors import UserInputError

            raise UserInputError(
                "this PyAV build has no libx264 encoder; install av wheels from PyPI"
            ) from None
        Path(self.clips_dir).mkdir(parents=True, exist_ok=True)

    def process(self, plans):
        return transcode_source(plans.plans, Path(self.clips_dir), self.cfg, self.samples)
