"""Encode each shot while its source is decoded for analysis, so a source is decoded once, not twice.

The detector reports a cut a few frames after it happens (`event_buffer_length`: AdaptiveDetector's
window, ContentDetector's flash filter). The recorder holds that many decoded frames back; a frame
older than that is known to belong to the current shot and goes to its encoder. Each shot ends up in a
temporary file beside the clips; the transcode stage renames the ones that become a clip unchanged (a
whole shot, not stitched, split or trimmed) and cuts the rest from the source as before. A shot that
grows past `curation.max_seconds` will be split, so its encoding stops there; a late cut (one before a
frame already encoded) leaves a shot whose span no planned clip has, so it is simply not used.

Memory: `lag` decoded frames, plus, with embeddings on, a SAMPLE_SIDE thumbnail of every frame of the
current shot (at most max_seconds of them), from which the K samples are picked when its length is known."""

from __future__ import annotations

import math
import os
from collections import deque
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from vidforge.curate.items import RecordedShot, VideoInfo
from vidforge.curate.video.encoder import ClipEncoder, sample_indices
from vidforge.data.manifest import TMP_MARK, stable_id
from vidforge.profile.curation import Curation


class ShotRecorder:
    """Feed it every analysed frame (`push`) and every cut (`cut`) in decode order; `finish` returns the
    shots it recorded. `discard` deletes them all (the source failed)."""

    def __init__(self, source: str, clips_dir: Path, cfg: Curation, lag: int, samples: int):
        self.source, self.clips_dir, self.cfg, self.samples = source, clips_dir, cfg, samples
        self.lag = lag + 1  # one more than the detector's delay, so a cut reported now is never behind us
        self.buffer: deque[tuple[int, av.VideoFrame]] = deque()
        self.cuts: set[int] = set()
        self.encoded_up_to = -1  # index of the last frame handed to an encoder
        self.shots: list[RecordedShot] = []
        self.info: VideoInfo | None = None
        self.time_base = Fraction(1)
        self.max_frames = 0
        self._encoder: ClipEncoder | None = None
        self._start = 0
        self._thumbs: list[np.ndarray] = []
        self._over = False  # the current shot outgrew max_seconds: not encoded further

    def begin(self, info: VideoInfo, time_base: Fraction) -> None:
        """The source's stream, as known at its first frame (size, rotation, rate)."""
        self.info, self.time_base = info, time_base
        self.max_frames = max(1, math.floor(self.cfg.max_seconds * float(info.fps) + 1e-9))

    def push(self, index: int, frame: av.VideoFrame) -> None:
        self.buffer.append((index, frame))
        while len(self.buffer) > self.lag:
            self._encode(*self.buffer.popleft())

    def cut(self, index: int) -> None:
        """A new shot opens at frame `index` (ignored if that frame is already encoded: a late cut)."""
        if index > self.encoded_up_to:
            self.cuts.add(index)

    def finish(self) -> list[RecordedShot]:
        while self.buffer:
            self._encode(*self.buffer.popleft())
        self._close_shot(self.encoded_up_to + 1)
        return self.shots

    def discard(self) -> None:
        if self._encoder is not None:
            self._encoder.abort()
            self._encoder.path.unlink(missing_ok=True)
            self._encoder = None
        for shot in self.shots:
            Path(shot.path).unlink(missing_ok=True)
        self.shots = []

    def _encode(self, index: int, frame: av.VideoFrame) -> None:
        if index in self.cuts or index == 0:
            self._close_shot(index)
            self._open_shot(index, frame.pts)
        self.encoded_up_to = index
        if self._over:
            return
        if index - self._start >= self.max_frames:  # the shot will be split: cut from the source later
            self._encoder.abort()
            self._encoder.path.unlink(missing_ok=True)
            self._encoder, self._thumbs, self._over = None, [], True
            return
        self._encoder.add(frame)

    def _open_shot(self, index: int, first_pts: int) -> None:
        name = f".shot-{stable_id(self.source)}-{index}{TMP_MARK}{os.getpid()}.mp4"
        self.clips_dir.mkdir(parents=True, exist_ok=True)
        keep = self._keep_thumbnail if self.samples else None
        self._encoder = ClipEncoder(
            self.clips_dir / name, self.info, self.time_base, first_pts, self.cfg, keep
        )
        self._start, self._thumbs, self._over = index, [], False

    def _keep_thumbnail(self, converted: av.VideoFrame) -> None:
        self._thumbs.append(self._encoder.thumbnail(converted))

    def _close_shot(self, end: int) -> None:
        encoder = self._encoder
        if encoder is None:
            return
        encoder.close()  # before letting go of it: a deinterlaced shot's last frame comes out here
        self._encoder = None
        picks = sample_indices(end - self._start, self.samples) if self.samples else []
        self.shots.append(
            RecordedShot(
                start=self._start,
                end=end,
                path=str(encoder.path),
                frames=encoder.written,
                width=encoder.width,
                height=encoder.height,
                fps=float(encoder.rate),
                samples=np.stack([self._thumbs[i] for i in picks]) if picks else None,
            )
        )
        self._thumbs = []
