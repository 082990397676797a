"""`vidforge bench curate`: throughput of each stage of `vidforge clip` and of `vidforge caption`, run by
their own code (`vidforge.curate.clip.run`, `vidforge.curate.caption.run`) on the given videos (e.g. from
`examples/make_sample_videos.py`), into a scratch directory.

Per executor stage: items, busy seconds (summed over its workers), items per busy second, and for the
clip stages also source frames and seconds of video per busy second; per caption annotation: clips per
second (the caption run's own timings); and wall-clock throughput of each whole command."""

from __future__ import annotations

import tempfile
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from vidforge.errors import UserInputError
from vidforge.profile import RunProfile


@dataclass
class StageRow:
    command: str
    stage: str
    items: int
    seconds: float
    items_per_s: float | None
    frames_per_s: float | None = None
    video_seconds_per_s: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def source_frames_and_seconds(videos: list[str]) -> tuple[int, float]:
    """Frames and seconds of the source videos, from their container headers."""
    import av

    frames, seconds = 0, 0.0
    for path in videos:
        with av.open(path) as container:
            stream = container.streams.video[0]
            duration = (
                float(stream.duration * stream.time_base) if stream.duration else container.duration / 1e6
            )
            rate = Fraction(stream.average_rate) if stream.average_rate else Fraction(0)
            frames += stream.frames or round(duration * rate)
            seconds += duration
    return frames, seconds


def _rate(n: float, seconds: float) -> float | None:
    return n / seconds if seconds > 0 else None


def run(profile: RunProfile, inputs: list[str], work_dir: str | Path | None = None) -> dict[str, Any]:
    from vidforge.curate import caption, clip
    from vidforge.curate.inputs import expand_inputs

    videos = expand_inputs(list(inputs), profile.curation.extensions)
    if not videos:
        raise UserInputError(
            f"no videos with extensions {list(profile.curation.extensions)} in {inputs}; "
            "make some with: python examples/make_sample_videos.py runs/samples"
        )
    frames, seconds = source_frames_and_seconds(videos)
    scratch = tempfile.TemporaryDirectory(prefix="vidforge-bench-curate-") if work_dir is None else None
    root = Path(scratch.name if scratch else work_dir)  # type: ignore[arg-type]
    try:
        clipped = clip.run(profile, videos, root / "clips")
        clip_wall = float(clipped.summary["wall_seconds"])
        rows = [
            StageRow(
                "clip",
                "(whole command, wall clock)",
                len(videos),
                clip_wall,
                _rate(len(videos), clip_wall),
                _rate(frames, clip_wall),
                _rate(seconds, clip_wall),
            )
        ]
        busy = sum(s.busy_seconds for s in clipped.stages)
        # Set-up overlaps the work (models load while sources decode), so this is the wall time in which
        # no stage worked (e.g. items waiting for a model), not the set-up's own length.
        idle = max(0.0, clip_wall - busy)
        rows.append(StageRow("clip", "(wall not in stage work: set-up, start-up)", 0, idle, None))
        for s in clipped.stages:
            rows.append(
                StageRow(
                    "clip",
                    s.name,
                    s.items_in,
                    s.busy_seconds,
                    _rate(s.items_in, s.busy_seconds),
                    _rate(frames, s.busy_seconds),
                    _rate(seconds, s.busy_seconds),
                )
            )
        captioned = caption.run(profile, root / "clips", root / "captions")
        clips = captioned.clips
        rows.append(
            StageRow(
                "caption",
                "(whole command, wall clock)",
                clips,
                captioned.wall_seconds,
                _rate(clips, captioned.wall_seconds),
            )
        )
        for s in captioned.stages:
            rows.append(
                StageRow(
                    "caption", s["stage"], s["items"], s["busy_seconds"], _rate(s["items"], s["busy_seconds"])
                )
            )
        for step, t in captioned.timings.items():
            rows.append(
                StageRow(
                    "caption",
                    f"annotation: {step}",
                    int(t.get("clips") or 0),
                    float(t.get("seconds") or 0),
                    t.get("clips_per_s"),
                )
            )
    finally:
        if scratch is not None:
            scratch.cleanup()
    return {
        "profile": profile.name,
        "videos": len(videos),
        "source_frames": frames,
        "source_seconds": round(seconds, 3),
        "clips": clipped.summary.get("clips"),
        "rows": [r.as_dict() for r in rows],
    }
