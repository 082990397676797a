"""`vidforge clip` on the odd sources of issue 23, point 8: a source whose first frame shows at 1.075 s has
its clip start there; a variable-frame-rate source's record says its frames were re-timed; an empty file,
random bytes and a truncated video each get their own reason instead of one "Invalid data"."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
from curation_fixtures import CLIP_OPEN_SETS

from vidforge.curate import clip
from vidforge.profile import load_profile

SETS = CLIP_OPEN_SETS


def _write(path: Path, times_ms: list[int]) -> Path:
    """A 32x16 H.264 video whose frames show at `times_ms` (a slow change: one shot, not static)."""
    tb = Fraction(1, 1000)
    with av.open(str(path), "w") as c:
        s = c.add_stream("libx264", rate=24)
        s.width, s.height, s.pix_fmt, s.time_base = 32, 16, "yuv420p", tb
        s.codec_context.time_base, s.options = tb, {"bframes": "0"}
        for i, t in enumerate(times_ms):
            img = np.zeros((16, 32, 3), np.uint8)
            img[:, :16] = (200, 30, 30)
            img[:8] += np.uint8(3 * i)
            f = av.VideoFrame.from_ndarray(img, format="rgb24")
            f.pts, f.time_base = t, tb
            c.mux(s.encode(f))
        c.mux(s.encode(None))
    return path


@pytest.fixture(scope="module")
def odd_run(tmp_path_factory, sample_videos):
    src = tmp_path_factory.mktemp("odd")
    _write(src / "delayed_start.mp4", [1075 + round(i * 1000 / 24) for i in range(30)])
    _write(src / "vfr.mp4", [sum(20 if k % 2 else 60 for k in range(i)) for i in range(30)])
    _write(src / "constant.mp4", [round(i * 1000 / 24) for i in range(30)])
    (src / "empty.mp4").write_bytes(b"")
    (src / "random.mp4").write_bytes(np.random.default_rng(0).integers(0, 256, 5000, np.uint8).tobytes())
    good = (sample_videos / "cuts.mp4").read_bytes()
    (src / "truncated.mp4").write_bytes(good[: len(good) // 2])
    out = tmp_path_factory.mktemp("odd_out")
    clip.run(load_profile(None, SETS), [str(src)], out)
    records = {
        Path(r["source"]).name: r for r in map(json.loads, (out / "manifest.jsonl").read_text().splitlines())
    }
    errors = {
        Path(e["source"]).name: e for e in map(json.loads, (out / "errors.jsonl").read_text().splitlines())
    }
    return records, errors


def test_a_delayed_first_frame_starts_the_clip_where_it_shows(odd_run):
    records, _ = odd_run
    delayed = records["delayed_start.mp4"]
    assert delayed["start_s"] == pytest.approx(1.075, abs=1e-3)
    assert delayed["end_s"] - delayed["start_s"] == pytest.approx(delayed["duration_s"], abs=0.05)
    assert records["constant.mp4"]["start_s"] == 0.0


def test_a_variable_rate_source_is_recorded_as_retimed(odd_run):
    records, _ = odd_run
    assert records["vfr.mp4"]["source_variable_rate"] is True
    assert records["constant.mp4"]["source_variable_rate"] is False
    assert records["delayed_start.mp4"]["source_variable_rate"] is False


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("empty.mp4", "cannot open: empty file (0 bytes)"),
        ("random.mp4", "cannot open: not a video file: its first bytes match no container format"),
        ("truncated.mp4", "cannot open: truncated or corrupt MP4/QuickTime file"),
    ],
)
def test_unopenable_files_say_which_kind_of_broken(odd_run, name, reason):
    _, errors = odd_run
    assert errors[name]["reason"].startswith(reason), errors[name]["reason"]
