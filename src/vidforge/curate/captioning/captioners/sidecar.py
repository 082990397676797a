"""Captions that came with the source videos, mapped to clips by time overlap.

Two sources: a per-video JSON sidecar `[{start, end, text}]` (seconds, end exclusive) next to each source
video, as `examples/make_sample_videos.py` writes (else a `<video>.txt` beside it: one caption for the whole
video, as `vidforge finetune` takes them), or a CSV `path,caption` (optionally with `start,end`
columns; without them the caption spans the whole video). A segment captions a clip when it covers at
least `min_overlap` of the clip's duration; the segment with the largest overlap wins."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vidforge.curate.captioning.captioners import CaptionResult, ClipItem
from vidforge.errors import UserInputError
from vidforge.files import read_csv, read_text_inside

SIDECAR_SUFFIX = ".captions.json"
TEXT_SUFFIX = ".txt"  # a plain caption of the whole video, beside it


@dataclass(frozen=True)
class Segment:
    start: float
    end: float  # None in the file (or no column) means "to the end of the video"
    text: str


def overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    """Length of the intersection of [a0, a1) and [b0, b1)."""
    return max(0.0, min(a1, b1) - max(a0, b0))


def best_segment(segments: list[Segment], start: float, end: float, min_overlap: float) -> Segment | None:
    """The segment covering the largest part of [start, end), if it covers at least `min_overlap` of it
    (ties go to the earlier segment)."""
    duration = max(end - start, 1e-9)
    best, best_len = None, 0.0
    for seg in segments:
        length = overlap(seg.start, seg.end, start, end)
        if length > best_len + 1e-9:
            best, best_len = seg, length
    if best is None or best_len / duration < min_overlap - 1e-9:
        return None
    return best


def read_json_sidecar(path: Path) -> list[Segment]:
    # beside a source video, it is data: a link out of the video's folder is refused, not read
    data = json.loads(read_text_inside(path, path.parent, "the caption sidecar"))
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a list of {{start, end, text}}")
    return [
        _segment(d.get("start"), d.get("end"), str(d["text"]), f"{path}: segment {i}")
        for i, d in enumerate(data)
    ]


def read_csv_captions(path: Path) -> dict[str, list[Segment]]:
    """{normalised video path: segments} from a CSV with `path,caption` (and optional `start,end`)."""
    table: dict[str, list[Segment]] = {}
    names, rows = read_csv(path, "the caption CSV")
    missing = {"path", "caption"} - set(names)
    if missing:
        raise UserInputError(
            f"{path}: the caption CSV needs the columns path,caption (missing {sorted(missing)})"
        )
    for number, row in enumerate(rows, 2):
        seg = _segment(row.get("start"), row.get("end"), row["caption"], f"{path}: line {number}")
        for key in _keys(row["path"], base=path.parent):
            table.setdefault(key, []).append(seg)
    return table


def _segment(start: Any, end: Any, text: str, where: str) -> Segment:
    """A segment from its file's values: start empty means 0, end empty the end of the video; anything
    else must be a finite number of seconds, end after start (end=nan matched no clip, silently)."""
    bounds = []
    for name, value, empty in (("start", start, 0.0), ("end", end, float("inf"))):
        if value in (None, ""):
            bounds.append(empty)
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = float("nan")
        if not math.isfinite(number):
            raise UserInputError(
                f"{where}: {name}={value!r} is not a number of seconds; write the time, or leave {name} empty"
            )
        bounds.append(number)
    if bounds[1] <= bounds[0]:
        raise UserInputError(f"{where}: end={end} is not after start={start}; fix the segment's times")
    return Segment(bounds[0], bounds[1], text)


def _keys(video: str | os.PathLike, base: Path | None = None) -> list[str]:
    """Names a video can be matched by: its resolved path (relative ones resolved against `base`) and its
    file name, so a CSV listing `videos/a.mp4` matches a manifest saying `/data/videos/a.mp4`."""
    p = Path(video)
    if not p.is_absolute() and base is not None:
        p = base / p
    return [str(p.resolve()), Path(video).name]


class SidecarCaptioner:
    name = "sidecar"
    frames = 0

    def __init__(self, settings: Any):
        self.settings = settings
        self._csv: dict[str, list[Segment]] | None = None
        self._json_cache: dict[str, list[Segment] | None] = {}

    def setup(self) -> None:
        if self.settings.path:
            path = Path(self.settings.path)
            if not path.is_file():
                raise UserInputError(
                    f"curation.caption.sidecar.path: no such file {path}; give a CSV path,caption"
                )
            self._csv = read_csv_captions(path)

    def segments_for(self, source: str) -> tuple[list[Segment] | None, str]:
        """The caption segments of one source video, and where they came from."""
        if self._csv is not None:
            for key in _keys(source):
                if key in self._csv:
                    return self._csv[key], f"sidecar:{Path(self.settings.path).name}"
            return None, "sidecar:csv"
        if source not in self._json_cache:
            self._json_cache[source] = None
            src = Path(source)
            for candidate in (src.with_name(src.name + SIDECAR_SUFFIX), src.with_suffix(SIDECAR_SUFFIX)):
                if candidate.is_file():
                    self._json_cache[source] = read_json_sidecar(candidate)
                    break
            else:  # `<video>.txt`, as finetune, finetrainers and musubi-tuner take captions: the whole video
                text = src.with_suffix(TEXT_SUFFIX)
                if text.is_file():
                    caption = read_text_inside(text, text.parent, "its caption").strip()
                    self._json_cache[source] = [Segment(0.0, float("inf"), caption)]
        return self._json_cache[source], "sidecar:json"

    def caption_one(self, record: dict[str, Any]) -> CaptionResult:
        source = str(record.get("source", ""))
        segments, where = self.segments_for(source)
        if segments is None:
            return CaptionResult(None, where, error=f"no caption sidecar for {source}", missing=True)
        seg = best_segment(
            segments, float(record["start_s"]), float(record["end_s"]), self.settings.min_overlap
        )
        if seg is None:
            return CaptionResult("", where, missing=True)  # nothing overlaps enough: flagged empty downstream
        return CaptionResult(seg.text, where)

    def caption(self, items: list[ClipItem]) -> list[CaptionResult]:
        if self._csv is None and self.settings.path:
            self.setup()
        results = []
        for item in items:
            try:
                results.append(self.caption_one(item.record))
            except Exception as err:  # noqa: BLE001 - a bad sidecar fails its clips, not the batch
                results.append(CaptionResult(None, "sidecar", error=f"{type(err).__name__}: {err}"))
        return results
