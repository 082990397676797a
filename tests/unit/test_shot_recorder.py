"""ShotRecorder on synthetic frames: each shot becomes its own file holding exactly its frames, a cut
reported within the detector's delay still splits, a later one cannot (and is ignored), a shot that
outgrows max_seconds is not recorded, and a failed source leaves no files."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest

from vidforge.curate.clipping.shot_recorder import ShotRecorder
from vidforge.curate.items import VideoInfo
from vidforge.curate.video.encoder import sample_indices
from vidforge.profile.curation import Curation

W, H, FPS = 64, 48, 10
# A distinct, well-separated colour per source frame, so a decoded frame says which frame it was.
PALETTE = np.array([(r, g, b) for r in (30, 130, 230) for g in (30, 230) for b in (30, 230)], np.float64)


def _frame(i: int) -> av.VideoFrame:
    rgb = np.empty((H, W, 3), np.uint8)
    rgb[:] = PALETTE[i]
    frame = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format="yuv420p")
    frame.pts = i
    return frame


def _which(rgb: np.ndarray) -> int:
    """The source frame an (encoded, decoded) image shows: the nearest palette colour."""
    return int(np.argmin(np.abs(PALETTE - rgb.reshape(-1, 3).mean(axis=0)).sum(axis=1)))


def _frames_in(path) -> list[int]:
    with av.open(str(path)) as c:
        return [_which(f.to_ndarray(format="rgb24")) for f in c.decode(video=0)]


def _recorder(tmp_path, lag: int = 2, samples: int = 0, **cfg) -> ShotRecorder:
    rec = ShotRecorder("src.mp4", tmp_path, Curation(**cfg), lag, samples)
    rec.begin(VideoInfo(W, H, Fraction(FPS), 0, 0.0, "h264"), Fraction(1, FPS))
    return rec


def test_each_shot_holds_exactly_its_frames_and_late_cuts_are_ignored(tmp_path):
    rec = _recorder(tmp_path, lag=2)
    for i in range(12):
        rec.push(i, _frame(i))
        if i == 6:
            rec.cut(4)  # reported 2 frames late, as a detector with window 2 does: still splits
        if i == 9:
            rec.cut(2)  # frame 2 went to the encoder long ago: cannot split any more
    shots = rec.finish()
    assert [(s.start, s.end, s.frames) for s in shots] == [(0, 4, 4), (4, 12, 8)]
    for shot in shots:
        assert _frames_in(shot.path) == list(range(shot.start, shot.end))
        assert (shot.width, shot.height, shot.fps) == (W, H, FPS)
    assert sorted(tmp_path.iterdir()) == sorted(Path(s.path) for s in shots)  # nothing else left behind


def test_a_shot_longer_than_max_seconds_is_not_recorded(tmp_path):
    rec = _recorder(tmp_path, lag=0, max_seconds=0.5, min_seconds=0.1)  # 5 frames at most
    for i in range(12):
        if i == 3:
            rec.cut(3)
        rec.push(i, _frame(i))
    shots = rec.finish()
    assert [(s.start, s.end) for s in shots] == [(0, 3)]  # [3, 12) will be split: cut from the source later
    assert list(tmp_path.iterdir()) == [Path(shots[0].path)]  # the longer shot's partial file is gone


def test_samples_are_the_frames_a_planned_clip_would_sample(tmp_path):
    rec = _recorder(tmp_path, lag=1, samples=3)
    for i in range(9):
        rec.push(i, _frame(i))
    (shot,) = rec.finish()
    picks = sample_indices(9, 3)
    assert shot.samples.shape[0] == 3
    assert [_which(s) for s in shot.samples] == picks


def test_discard_leaves_no_files(tmp_path):
    rec = _recorder(tmp_path, lag=0)
    for i in range(6):
        if i == 3:
            rec.cut(3)
        rec.push(i, _frame(i))
    rec.discard()  # the source failed part-way: the finished shot and the open one both go
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("rate", "sources"),
    [
        (5.0, [0, 2, 4, 6, 8]),  # halving: every other frame, the one on screen at each output time
        (20.0, [i // 2 for i in range(20)]),  # doubling: each frame twice
        (4.0, [0, 2, 5, 7]),  # 10 -> 4 fps: output k at k/4 s shows source frame floor(k * 10 / 4)
    ],
)
def test_resampling_shows_the_frame_on_screen_and_keeps_the_duration(tmp_path, rate, sources):
    rec = _recorder(tmp_path, lag=0, fps=rate, min_seconds=0)
    for i in range(10):
        rec.push(i, _frame(i))
    (shot,) = rec.finish()
    assert (shot.start, shot.end, shot.frames, shot.fps) == (0, 10, len(sources), rate)  # 1 s at `rate`
    assert _frames_in(shot.path) == sources


def test_an_encoder_thread_failure_is_raised_to_the_caller_and_nothing_hangs(tmp_path):
    """The encode runs in a thread of its own: its error must reach the analysing thread (the source
    then fails and is recorded as such), not vanish or block the queue."""
    blocked = tmp_path / "not_a_folder"
    blocked.write_text("")  # the shots' folder is a file: opening the first shot's encoder fails
    rec = ShotRecorder("src.mp4", blocked, Curation(), 0, 0)
    rec.begin(VideoInfo(W, H, Fraction(FPS), 0, 0.0, "h264"), Fraction(1, FPS))
    with pytest.raises(OSError):
        for i in range(40):  # more frames than the queue holds: a dead writer must not block `push`
            rec.push(i, _frame(i))
        rec.finish()
    rec.discard()
    assert list(tmp_path.iterdir()) == [blocked]
