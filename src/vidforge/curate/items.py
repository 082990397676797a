"""What flows between the clip stages. Plain dataclasses of numbers and small arrays (picklable, cheap to
send to a worker process or a Ray actor)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import numpy as np


@dataclass
class VideoInfo:
    """A source's video stream as decoded. `width`/`height` are as displayed, in square pixels (sample
    aspect and rotation applied: video/geometry.py); `coded_*` are the decoded frames' own."""

    width: int
    height: int
    fps: Fraction
    frames: int
    duration_s: float
    codec: str
    rotation: int = 0
    variable_rate: bool = False
    coded_width: int = 0
    coded_height: int = 0
    sample_aspect: Fraction = Fraction(1)
    interlaced: bool = False  # its first frame is flagged interlaced


@dataclass
class Shot:
    """Frames [start, end) of one source; `score` is the detector's score at the cut that opens it."""

    start: int
    end: int
    score: float | None = None
    merged: int = 1  # shots this one was stitched from


@dataclass
class RecordedShot:
    """Frames [start, end) of a source, encoded at `path` (a temporary name until a clip adopts it)."""

    start: int
    end: int
    path: str
    frames: int  # frames written (differs from end - start when curation.fps resamples)
    width: int
    height: int
    fps: float
    samples: np.ndarray | None = None  # (K, h, w, 3) uint8 at sample_indices(end - start, K)


@dataclass
class Analysis:
    """Stage 1's output for one source: shots, per-frame static flags and stitching thumbnails."""

    source: str
    info: VideoInfo
    pts: np.ndarray  # int64 presentation timestamps, one per frame, in `time_base` units
    time_base: Fraction
    shots: list[Shot]
    static: np.ndarray  # bool per frame: grey mean abs difference to the previous frame below threshold
    boundary: dict[int, np.ndarray] = field(default_factory=dict)  # frame index -> RGB thumbnail (H, W, 3)
    recorded: list[RecordedShot] = field(default_factory=list)  # shots encoded during the decode

    @property
    def label(self) -> str:
        return self.source


@dataclass
class ClipPlan:
    """One clip to cut (or one that a filter rejected: `rejected` holds the stage and reason)."""

    source: str
    clip_id: str
    start: int
    end: int  # exclusive
    info: VideoInfo
    pts: np.ndarray  # the clip's frame timestamps (to find its first frame after a seek)
    time_base: Fraction
    start_s: float
    end_s: float
    score: float | None
    static_ratio: float
    stitched: int = 1
    rejected: tuple[str, str] | None = None  # (stage, reason)
    index: int = 1  # 1-based place among its source's clips (rejected ones included), in time order

    @property
    def label(self) -> str:
        return f"{self.source}[{self.start}:{self.end}]"

    @property
    def file_name(self) -> str:
        """What a person browsing the clips folder reads: the source's name and the clip's index beside
        its id, as scenedetect's `VIDEO-Scene-001.mp4` (`beach-Scene-003-1f2e...mp4`)."""
        stem = (
            re.sub(r"[^A-Za-z0-9._-]+", "_", Path(self.source.rstrip("/")).stem)[:48].strip("._") or "source"
        )
        return f"{stem}-Scene-{self.index:03d}-{self.clip_id}.mp4"


@dataclass
class ClipResult:
    """A transcoded clip: where it is, what it holds, K sampled frames for the embedding stage."""

    plan: ClipPlan
    path: str
    frames: int
    width: int
    height: int
    fps: float
    samples: np.ndarray | None = None  # (K, h, w, 3) uint8, dropped after embedding
    embedding: np.ndarray | None = None  # (D,) float32, normalised
    recorded: bool = False  # a shot recorded during analysis (no second decode), not cut from the source

    @property
    def label(self) -> str:
        return self.plan.label
