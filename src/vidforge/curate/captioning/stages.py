"""The stages of `vidforge caption` on the curate executors: `decode` (a process pool: PyAV holds the GIL)
-> `annotate` (one model-holding worker that batches clips: captions, then every enabled filter).

A unit is one clip (its id). Neither stage ever drops a clip: a clip that fails to decode goes on as a
`Decoded` with `error` set, and `annotate` turns it into a rejected row and an error record. This
module imports no torch: the decode workers (forked from a server that preloads it) start fast.

Models load in `AnnotateStage.setup` (a `slow_setup`: on a background thread of the driver, while the
decode workers start on the first clips). With the local executor the stage runs on a thread of the
driver, so the driver's `setup` loads the one copy that serves every batch. With Ray the stage runs in
actors: the driver's copy only checks (`load_models=False`), and each actor's unpickled copy loads its
own models (a pickled stage never carries a model)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vidforge.curate import filters
from vidforge.curate.captioning.annotator import CaptionAnnotator, Timings, media_of
from vidforge.curate.captioning.captioners import evenly_spaced
from vidforge.curate.stage import Stage
from vidforge.profile.caption import Caption

log = logging.getLogger(__name__)


def wanted_frames(cfg: Caption, count: int) -> set[int]:
    """Indices of the frames some annotation reads, for a clip of `count` frames (`cfg`: curation.caption)."""
    frames = {"coca": cfg.coca.frames, "endpoint": cfg.endpoint.frames}
    caption_frames = max(frames.get(cfg.backend, 0), frames.get(cfg.fallback or "", 0))
    idx: set[int] = set()
    if caption_frames:
        idx.update(evenly_spaced(count, caption_frames))
    scorers = filters.enabled(cfg)
    if any(s.uses_clip for s in scorers):
        idx.update(evenly_spaced(count, cfg.clip.frames))
    for scorer in scorers:
        idx.update(scorer.frames(count))
    return idx


ClipRecord = dict[str, Any]
"""One line of a `vidforge clip` manifest (clip_id, media, source, timing, ...): `decode`'s input."""


@dataclass
class Decoded:
    """A clip record with its decoded frames, or the reason it could not be decoded."""

    record: ClipRecord
    num_frames: int = 0
    frames: dict[int, np.ndarray] = field(default_factory=dict)
    error: str | None = None
    seconds: float = 0.0

    @property
    def label(self) -> str:
        return str(self.record.get("clip_id", ""))


@dataclass
class Annotated:
    """`annotate`'s output for one clip: the manifest row and its error records. The first clip of each
    batch also carries the batch's step timings and which models had random weights."""

    row: dict[str, Any]
    errors: list[dict[str, Any]]
    timings: dict[str, tuple[float, int]] = field(default_factory=dict)
    random_weights: list[str] = field(default_factory=list)


def decode_frames(path: Path, wanted: Callable[[int], set[int]]) -> tuple[int, dict[int, np.ndarray]]:
    """The frame count of a clip and its frames at `wanted(count)` as RGB uint8, decoding it once."""
    import av
    from av.video.reformatter import VideoReformatter

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        count = stream.frames
        if count <= 0:  # no count in the header: count by decoding (clips are short)
            count = sum(1 for _ in container.decode(stream))
            container.seek(0)
        keep = wanted(count)
        frames: dict[int, np.ndarray] = {}
        last = max(keep, default=-1)
        to_rgb = VideoReformatter()  # one swscale context, not one per frame
        for i, frame in enumerate(container.decode(stream)):
            if i in keep:
                frames[i] = to_rgb.reformat(frame, format="rgb24").to_ndarray()
            if i >= last:
                break
    if set(frames) != keep:  # the header over-counted: fall back to what was decoded
        missing = keep - set(frames)
        if not frames:
            raise ValueError(f"no decodable frames in {path.name}")
        count = max(frames) + 1
        log.debug("%s: %d wanted frames beyond the end", path.name, len(missing))
        frames = {i: f for i, f in frames.items() if i < count}
    return count, frames


def decode_record(record: dict[str, Any], cfg: Caption, clips_dir: Path) -> Decoded:
    t0 = time.perf_counter()
    try:
        count, frames = decode_frames(media_of(record, clips_dir), lambda n: wanted_frames(cfg, n))
        return Decoded(record, count, frames, seconds=time.perf_counter() - t0)
    except Exception as err:  # noqa: BLE001 - this clip's error, recorded by annotate
        return Decoded(record, error=f"{type(err).__name__}: {err}", seconds=time.perf_counter() - t0)


class DecodeStage(Stage[ClipRecord, Decoded]):
    """Clip record -> `Decoded` (the frames every enabled annotation asks for, decoded once)."""

    name = "decode"
    kind = "process"

    def __init__(self, cfg: Caption, clips_dir: str | Path, workers: int = 1):
        self.cfg, self.clips_dir, self.workers = cfg, Path(clips_dir), workers

    def process(self, item: ClipRecord) -> Decoded:
        return decode_record(item, self.cfg, self.clips_dir)


class AnnotateStage(Stage[Decoded, Annotated]):
    """Batches of `Decoded` -> `Annotated`, one per clip, through one `CaptionAnnotator`."""

    name = "annotate"
    kind = "thread"
    slow_setup = True
    workers = 1

    def __init__(
        self,
        cfg: Caption,
        clips_dir: str | Path,
        *,
        load_models: bool = True,
        annotator: CaptionAnnotator | None = None,
    ):
        self.cfg, self.clips_dir = cfg, Path(clips_dir)
        self.batch_size = cfg.batch_clips
        self.load_models = load_models
        self.resources = {"num_cpus": 1, "num_gpus": 1 if cfg.device == "cuda" else 0}
        self.annotator = annotator

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(annotator=None, load_models=True)  # a worker's copy builds and loads its own
        return state

    def setup(self) -> None:
        from vidforge.curate.captioning.checks import check_inputs

        if self.annotator is None:
            check_inputs(self.cfg, [])
            self.annotator = CaptionAnnotator(self.cfg, self.clips_dir)
        if self.load_models:
            self.annotator.setup()

    def process_batch(self, items: list[Decoded]) -> list[Annotated]:
        if self.annotator is None or not self.load_models:
            self.load_models = True
            self.setup()
        annotator = self.annotator
        annotator.timings = Timings()
        for item in items:
            annotator.timings.add("decode", item.seconds, 1)
        done = [Annotated(row, errs) for row, errs in annotator.annotate(items)]
        if done:
            done[0].timings = {
                s: (annotator.timings.seconds[s], annotator.timings.clips[s])
                for s in annotator.timings.seconds
            }
            done[0].random_weights = list(annotator.random_weights)
        return done

    def teardown(self) -> None:
        if self.annotator is not None:
            self.annotator.teardown()
