"""Shot recording in a second process, so one source's analysis and encoding run on two cores.

A source is one unit of work; alone on a machine (a single long video), its decode + detection and its
x264 encode share one process (the encode in a thread of its own, shot_recorder.py). `RecorderProcess`
stands where `ShotRecorder` stands in `decode._analyse`, with its interface, and runs the real
ShotRecorder in a child process that decodes the source a second time on its own.

The child does exactly what the in-process recorder would: the analysing parent sends, in order, each
cut it would have handed the recorder and a `push` marker for each frame; the child decodes the same
frames (the same timestamp rules), and before pushing frame i into its ShotRecorder it applies every
message up to the parent's `push i`, so each cut reaches the recorder at the same point of its frame
sequence as in one process and the recordings are the same files. Cuts are the parent's: detection
runs as before, so they stay PySceneDetect's. The cost is a second decode, so `clip` uses this only when
a core would otherwise idle (`curation.record_process`)."""

from __future__ import annotations

import logging
import multiprocessing
from fractions import Fraction
from pathlib import Path
from typing import Any

from vidforge.curate.clipping.shot_recorder import RecordingError, ShotRecorder
from vidforge.curate.items import RecordedShot, VideoInfo
from vidforge.curate.stage import one_line
from vidforge.curate.video.container import (
    Damaged,
    error_reason,
    frame_rate,
    open_source,
    undamaged,
    video_stream,
)
from vidforge.profile.curation import Curation

log = logging.getLogger(__name__)


class RecorderProcess:
    """ShotRecorder's interface (`begin`, `cut`, `push`, `finish`, `discard`), recorded by a child.

    As in one process, a shot file the child cannot write is a `RecordingError` naming the file, raised
    by the next call once the child has stopped (by `finish` at the latest): no fault of the source's, so
    the next run tries it again. Any other failure of the child (it died, its own decode failed where
    the parent's did not) leaves the clips to be cut from the source, with a warning."""

    def __init__(self, source: str, clips_dir: Path, cfg: Curation, lag: int, samples: int):
        self.source = source
        # Forked before the parent opens the source (no decoder threads in the parent to copy).
        context = multiprocessing.get_context("fork")
        self._conn, child = context.Pipe()
        self._proc = context.Process(
            target=_child, args=(child, source, clips_dir, cfg, lag, samples), daemon=True
        )
        self._proc.start()
        child.close()
        self._closed = False
        self._answer: tuple[str, Any] | None = None  # the child's answer, once it has stopped

    def begin(self, info: VideoInfo, time_base: Fraction) -> None:
        self._send(("begin", info, time_base))

    def cut(self, index: int) -> None:
        self._send(("cut", index))

    def push(self, index: int, frame: Any) -> None:
        self._send(("push", index))

    def finish(self) -> list[RecordedShot]:
        self._send(("finish",))
        kind, value = self._answer or self._receive()
        self._close()
        if kind == "recording":
            raise RecordingError(value)
        if kind == "error":  # the clips are then cut from the source, as when nothing was recorded
            log.warning(
                "%s: recording shots in a second process failed (%s); cutting from the source",
                self.source,
                value,
            )
            return []
        return value

    def discard(self) -> None:
        if not self._closed:
            self._send(("discard",), raising=False)
            if self._answer is None:
                self._receive()  # its files are gone once it answers
            self._close()

    def _send(self, message: tuple, raising: bool = True) -> None:
        """Send `message` to the child; once it has stopped (its end of the pipe is closed), read its
        answer instead, and raise its RecordingError."""
        if self._answer is None:
            try:
                self._conn.send(message)
            except OSError:  # BrokenPipeError: the child stopped, and its answer waits in the pipe
                self._answer = self._receive()
        if raising and self._answer is not None and self._answer[0] == "recording":
            raise RecordingError(self._answer[1])

    def _receive(self) -> tuple[str, Any]:
        try:
            return self._conn.recv()
        except (EOFError, OSError):
            return "error", "the recording process died"

    def _close(self) -> None:
        self._closed = True
        self._conn.close()
        self._proc.join(timeout=30)


def _child(conn, source: str, clips_dir: Path, cfg: Curation, lag: int, samples: int) -> None:
    recorder = ShotRecorder(source, clips_dir, cfg, lag, samples)
    try:
        message = conn.recv()
        outcome = _record(conn, source, recorder, message[1:]) if message[0] == "begin" else "discard"
        if outcome == "finish":
            conn.send(("done", recorder.finish()))
        else:
            recorder.discard()
            conn.send(("discarded", None))
    except BaseException as err:  # noqa: BLE001 - reported to the parent, which raises it or falls back
        recorder.discard()
        answer = ("recording", str(err)) if isinstance(err, RecordingError) else ("error", one_line(err))
        try:
            conn.send(answer)
        except OSError:
            pass
    finally:
        conn.close()


def _record(conn, source: str, recorder: ShotRecorder, begin: tuple) -> str:
    """Decode the source and push its frames as the parent's messages allow; 'finish' or 'discard'.
    Only the decoder's errors are the source's (Damaged); the recorder's are RecordingErrors."""
    recorder.begin(*begin)
    damaged = None
    with open_source(source) as container:
        stream = video_stream(container)
        stream.thread_type = "AUTO"
        step = max(1, round(1 / (frame_rate(stream) * stream.time_base)))
        last_pts, index = None, 0
        try:
            for frame in undamaged(container.decode(stream)):
                # The same timestamp rules as decode._analyse: a frame without one follows the last.
                pts = frame.pts if frame.pts is not None else (last_pts + step if last_pts is not None else 0)
                if last_pts is not None and pts <= last_pts:
                    continue
                last_pts = pts
                while True:  # every message the parent sent before its push of this frame
                    message = conn.recv()
                    if message[0] == "cut":
                        recorder.cut(message[1])
                    elif message[0] == "push":
                        break
                    else:
                        return message[0]
                recorder.push(index, frame)
                index += 1
        except Damaged as err:
            damaged = err  # the parent's decode fails there too, and has this discard what it recorded
    while (message := conn.recv())[0] in ("cut", "push"):  # the final cuts, then the end
        if message[0] == "cut":
            recorder.cut(message[1])
    if message[0] == "finish" and damaged is not None:  # the parent decoded further: the file changed
        raise RuntimeError(f"its decode failed after frame {index}: {error_reason(damaged.__cause__)}")
    return message[0]
