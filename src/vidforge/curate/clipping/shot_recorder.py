"""Encode each shot while its source is decoded for analysis, so a source is decoded once, not twice.

The detector reports a cut a few frames after it happens (`event_buffer_length`: AdaptiveDetector's
window, ContentDetector's flash filter). The recorder holds that many decoded frames back; a frame
older than that is known to belong to the current shot and goes to its encoder. Each shot ends up in a
temporary file beside the clips; the transcode stage renames the ones that become a clip unchanged (a
whole shot, not stitched, split or trimmed) and cuts the rest from the source as before. A shot that
grows past `curation.max_seconds` will be split, so its encoding stops there; a late cut (one before a
frame already encoded) leaves a shot whose span no planned clip has, so it is simply not used.

The encoding runs in a thread of its own (`_Writer`), fed in order through a short queue: PyAV's encode,
its conversions and x264 release the GIL, so the decode, the conversion for detection and the detectors
(the caller's thread) overlap with the encode instead of waiting for it. Which frames open, continue or
stop a shot is decided by the caller's thread, as frames leave the lag buffer, so the files are the same
as if one thread did both.

Memory: `lag` + QUEUE_FRAMES decoded frames, plus, with embeddings on, a SAMPLE_SIDE thumbnail of every frame of the
current shot (at most max_seconds of them), from which the K samples are picked when its length is known."""

from __future__ import annotations

import math
import os
import queue
import threading
from collections import deque
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from vidforge.curate.clipping import heap
from vidforge.curate.items import RecordedShot, VideoInfo
from vidforge.curate.stage import one_line
from vidforge.curate.video.encoder import ClipEncoder, sample_indices
from vidforge.data.manifest import TMP_MARK, stable_id
from vidforge.profile.curation import Curation

QUEUE_FRAMES = 8  # frames between the analysis and the encoder thread: absorbs jitter, bounds memory


class RecordingError(OSError):
    """The encoder thread failed writing a shot (a full disk, a file it cannot create): no fault of the
    source's, so not an ItemError, and the next run tries the source again. Names the shot's file."""


class ShotRecorder:
    """Feed it every analysed frame (`push`) and every cut (`cut`) in decode order; `finish` returns the
    shots it recorded. `discard` deletes them all (the source failed). An error in the encoder thread is
    raised by the next `push`, `finish` or `discard` call."""

    def __init__(self, source: str, clips_dir: Path, cfg: Curation, lag: int, samples: int):
        self.lag = lag + 1  # one more than the detector's delay, so a cut reported now is never behind us
        self.buffer: deque[tuple[int, av.VideoFrame]] = deque()
        self.cuts: set[int] = set()
        self.encoded_up_to = -1  # index of the last frame handed to the encoder thread
        self.max_frames = 0
        self._start = 0  # first frame of the current shot
        self._over = False  # the current shot outgrew max_seconds: not encoded further
        self._writer = _Writer(source, clips_dir, cfg, samples)
        heap.keep_freed_memory()  # one shot's encoder buffers reused by the next (heap.py)

    def begin(self, info: VideoInfo, time_base: Fraction) -> None:
        """The source's stream, as known at its first frame (size, rotation, rate)."""
        self._writer.info, self._writer.time_base = info, time_base
        self.max_frames = max(1, math.floor(self._writer.cfg.max_seconds * float(info.fps) + 1e-9))

    def push(self, index: int, frame: av.VideoFrame) -> None:
        self.buffer.append((index, frame))
        while len(self.buffer) > self.lag:
            self._hand_over(*self.buffer.popleft())

    def cut(self, index: int) -> None:
        """A new shot opens at frame `index` (ignored if that frame is already encoded: a late cut)."""
        if index > self.encoded_up_to:
            self.cuts.add(index)

    def finish(self) -> list[RecordedShot]:
        while self.buffer:
            self._hand_over(*self.buffer.popleft())
        self._writer.send(("close", self.encoded_up_to + 1))
        try:
            self._writer.stop()
        finally:
            heap.release()
        return self._writer.shots

    def discard(self) -> None:
        self._writer.stop(discarding=True)
        self._writer.discard()
        heap.release()

    def _hand_over(self, index: int, frame: av.VideoFrame) -> None:
        if index in self.cuts or index == 0:
            self._writer.send(("close", index))
            self._writer.send(("open", index, frame.pts))  # read here: the encoder thread restamps it
            self._start, self._over = index, False
        self.encoded_up_to = index
        if self._over:
            return
        if index - self._start >= self.max_frames:  # the shot will be split: cut from the source later
            self._writer.send(("drop",))
            self._over = True
            return
        self._writer.send(("add", frame))


class _Writer:
    """The encoder thread: applies the recorder's messages in order (open a shot's file, add a frame,
    drop the shot, close it). Started by the first message; `stop` lets it finish what is queued."""

    def __init__(self, source: str, clips_dir: Path, cfg: Curation, samples: int):
        self.source, self.clips_dir, self.cfg, self.samples = source, clips_dir, cfg, samples
        self.info: VideoInfo | None = None
        self.time_base = Fraction(1)
        self.shots: list[RecordedShot] = []
        self._queue: queue.Queue = queue.Queue(maxsize=QUEUE_FRAMES)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._skip = False  # discarding, or failed: drain the queue without encoding
        self._encoder: ClipEncoder | None = None
        self._start, self._path = 0, clips_dir
        self._thumbs: list[np.ndarray] = []

    def send(self, message: tuple) -> None:
        self._raise()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="shot-encoder", daemon=True)
            self._thread.start()
        self._queue.put(message)

    def stop(self, discarding: bool = False) -> None:
        """Wait for the queued messages to be applied (skipped when `discarding`); raise its error."""
        if self._thread is not None:
            self._skip = self._skip or discarding
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        if not discarding:
            self._raise()

    def discard(self) -> None:
        """Delete every file written (the thread is stopped). Runs while another error is raised, so a
        file it cannot delete (something else in its place) is left, without an error of its own."""
        paths = [Path(shot.path) for shot in self.shots]
        if self._encoder is not None:
            self._encoder.abort()
            paths.append(self._encoder.path)
        self._encoder, self.shots = None, []
        for path in paths:
            try:
                path.unlink(missing_ok=True)
            except OSError:
                pass

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        while (message := self._queue.get()) is not None:
            if self._skip:
                continue
            try:
                self._apply(*message)
            except Exception as err:  # noqa: BLE001 - raised in the recorder's thread by its next call
                self._error, self._skip = RecordingError(f"recording {self._path}: {one_line(err)}"), True
                self._error.__cause__ = err

    def _apply(self, kind: str, *args) -> None:
        if kind == "add":
            self._encoder.add(args[0])
        elif kind == "open":
            self._open_shot(*args)
        elif kind == "close":
            self._close_shot(*args)
        elif kind == "drop":
            self._encoder.abort()
            self._encoder.path.unlink(missing_ok=True)
            self._encoder, self._thumbs = None, []

    def _open_shot(self, index: int, first_pts: int) -> None:
        name = f".shot-{stable_id(self.source)}-{index}{TMP_MARK}{os.getpid()}.mp4"
        self._start, self._thumbs, self._path = index, [], self.clips_dir / name
        self.clips_dir.mkdir(parents=True, exist_ok=True)
        keep = self._keep_thumbnail if self.samples else None
        self._encoder = ClipEncoder(self._path, self.info, self.time_base, first_pts, self.cfg, keep)

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
