"""Stage 6: make each kept clip an H.264 (libx264, yuv420p) MP4, frame-accurately.

A clip that is a whole shot recorded while the source was decoded for analysis (shot_recorder.py) is that
recording, renamed. Any other (stitched, split, trimmed, or recorded at another size) is cut from the
source: seeked to the keyframe before the clip, decoded, and exactly the clip's frames (matched by
timestamp) re-encoded. Never a stream copy, so a clip holds its frames and none of the neighbouring
shot's. Both ways sample K frames for the clip embedding as they encode, so embedding costs no extra
decode."""

from __future__ import annotations

import os
from pathlib import Path

import av
import numpy as np

from vidforge.curate.clipping import heap
from vidforge.curate.clipping.plan import SourcePlans
from vidforge.curate.items import ClipPlan, ClipResult, RecordedShot
from vidforge.curate.stage import ItemError, Stage
from vidforge.curate.video.container import open_source, video_stream
from vidforge.curate.video.encoder import ClipEncoder, output_size, sample_indices
from vidforge.data.manifest import atomic_path
from vidforge.profile.curation import Curation


class _ClipWriter:
    """Encodes one planned clip from frames of its source: exactly the plan's frames (by timestamp), under
    a temporary name, renamed when complete."""

    def __init__(self, plan: ClipPlan, out_path: Path, cfg: Curation, samples: int):
        self.plan = plan
        self.want, self.wanted = plan.end - plan.start, {int(p) for p in plan.pts}
        self.last_pts = int(plan.pts[-1])
        self.picks = set(sample_indices(self.want, samples)) if samples else set()
        self.samples: list[np.ndarray] = []
        self._atomic = atomic_path(out_path)
        self.out_path = out_path
        self._seen = 0
        tmp = self._atomic.__enter__()
        self.encoder = ClipEncoder(tmp, plan.info, plan.time_base, int(plan.pts[0]), cfg, self._sample)

    @property
    def complete(self) -> bool:
        return self.encoder.taken == self.want

    def add(self, frame: av.VideoFrame) -> None:
        self.encoder.add(frame)

    def _sample(self, converted: av.VideoFrame) -> None:
        if self._seen in self.picks:
            self.samples.append(self.encoder.thumbnail(converted))
        self._seen += 1

    def finish(self) -> ClipResult:
        self.encoder.close()
        if not self.complete:
            self.abort()
            raise ItemError(
                f"decoded {self.encoder.taken} of the clip's {self.want} frames (source changed or damaged?)"
            )
        self._atomic.__exit__(None, None, None)
        enc = self.encoder
        return ClipResult(
            plan=self.plan,
            path=str(self.out_path),
            frames=enc.written,
            width=enc.width,
            height=enc.height,
            fps=float(enc.rate),
            samples=np.stack(self.samples) if self.samples else None,
        )

    def abort(self) -> None:
        self.encoder.abort()
        self._atomic.__exit__(ItemError, ItemError("aborted"), None)


def adopt_recorded(
    plans: list[ClipPlan], recorded: list[RecordedShot], clips_dir: Path, cfg: Curation
) -> tuple[list[ClipResult], list[ClipPlan]]:
    """Kept clips that are a shot recorded during analysis, unchanged, become that recording (renamed to
    the clip's name); returns them and the plans still to cut from the source. Recordings no clip takes
    are deleted."""
    by_span = {(r.start, r.end): r for r in recorded}
    adopted, rest = [], []
    for plan in plans:
        shot = by_span.pop((plan.start, plan.end), None)
        size = output_size(plan.info.width, plan.info.height, cfg.max_resolution)
        if shot is None or (shot.width, shot.height) != size:
            rest.append(plan)
            if shot is not None:
                Path(shot.path).unlink(missing_ok=True)
            continue
        path = clips_dir / plan.file_name
        os.replace(shot.path, path)
        adopted.append(
            ClipResult(
                plan=plan,
                path=str(path),
                frames=shot.frames,
                width=shot.width,
                height=shot.height,
                fps=shot.fps,
                samples=shot.samples,
                recorded=True,
            )
        )
    for shot in by_span.values():
        Path(shot.path).unlink(missing_ok=True)
    return adopted, rest


def transcode_source(plans: list[ClipPlan], clips_dir: Path, cfg: Curation, samples: int = 0) -> list:
    """Cut every kept clip of one source in a single decode pass (seeking once, to the first clip).
    Per-clip seeks would decode from the previous keyframe again for every clip: with long GOPs that
    costs more than the encode. Rejected plans and clips that fail come back as they are / as errors."""
    kept = sorted((p for p in plans if p.rejected is None), key=lambda p: p.start)
    results: list = [p for p in plans if p.rejected is not None]
    if not kept:
        return results
    source = kept[0].source
    heap.keep_freed_memory()  # one clip's encoder buffers reused by the next (heap.py)
    try:
        results += _cut(kept, source, clips_dir, cfg, samples)
    finally:
        heap.release()
    return results


def _cut(kept: list[ClipPlan], source: str, clips_dir: Path, cfg: Curation, samples: int) -> list[ClipResult]:
    """The kept clips (in order) from one decode of `source`."""
    results: list[ClipResult] = []
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
                    writer = _ClipWriter(queue[0], clips_dir / queue[0].file_name, cfg, samples)
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


class TranscodeStage(Stage[SourcePlans, ClipResult | ClipPlan]):
    """SourcePlans -> [ClipResult | rejected ClipPlan]: recorded shots adopted, the other clips cut in one
    decode pass. CPU-bound (decode + x264): worker processes, parallel across sources."""

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

    def runs_in_driver(self, plans: SourcePlans) -> bool:
        """Nothing to cut, only recordings to rename (or nothing kept)."""
        recorded = {(r.start, r.end) for r in plans.recorded}
        return all((p.start, p.end) in recorded for p in plans.plans if p.rejected is None)

    def process(self, plans: SourcePlans) -> list[ClipResult | ClipPlan]:
        clips_dir = Path(self.clips_dir)
        kept = [p for p in plans.plans if p.rejected is None]
        adopted, rest = adopt_recorded(kept, plans.recorded, clips_dir, self.cfg)
        rejected = [p for p in plans.plans if p.rejected is not None]
        return adopted + transcode_source(rejected + rest, clips_dir, self.cfg, self.samples)
