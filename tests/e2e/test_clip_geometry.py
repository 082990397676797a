"""`vidforge clip` on the geometry cameras and editors leave (issue 17): an anamorphic source comes out in
square pixels at its display aspect (its disc round again), an interlaced one deinterlaced (closer to the
picture at its first field's time than the woven source) or, with `deinterlace=none`, recorded as interlaced,
and a source at an odd size x264 refuses comes out at the even size below. Rotation: test_clip_cli.py."""

from __future__ import annotations

import json
from pathlib import Path

import av
import numpy as np
import pytest
from curation_fixtures import CLIP_OPEN_SETS
from make_sample_videos import write_geometry_samples

from vidforge.curate import clip
from vidforge.profile import load_profile

SETS = CLIP_OPEN_SETS


def _run(sources: list[Path], out: Path, *sets: str) -> dict[str, dict]:
    clip.run(load_profile(None, [*SETS, *sets]), [str(s) for s in sources], out)
    records = map(json.loads, (out / "manifest.jsonl").read_text().splitlines())
    return {Path(r["source"]).stem: r for r in records}


def _frames(path: Path) -> np.ndarray:
    with av.open(str(path)) as c:
        return np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)]).astype(np.float32)


@pytest.fixture(scope="module")
def geometry(tmp_path_factory) -> tuple[Path, dict]:
    src = tmp_path_factory.mktemp("geometry")
    return src, write_geometry_samples(src)


@pytest.mark.parametrize("record_shots", ["true", "false"])  # recorded while analysed / cut afterwards
def test_anamorphic_source_comes_out_at_its_display_aspect(geometry, tmp_path, record_shots):
    src, truth = geometry
    rec = _run([src / "anamorphic.mp4"], tmp_path, f"curation.record_shots={record_shots}")["anamorphic"]
    assert (rec["width"], rec["height"]) == (truth["anamorphic"]["display_width"], 72)
    assert (rec["source_coded_width"], rec["source_coded_height"]) == (88, 72)
    assert rec["source_sample_aspect"] == "16:11" and (rec["source_width"], rec["source_height"]) == (128, 72)
    first = _frames(tmp_path / rec["path"])[0].mean(axis=2)
    ys, xs = np.nonzero(first > 137)  # the disc (235) against the background (40): half way
    # Drawn round (radius 18) in square pixels: as wide as tall again, not 11/16 as wide.
    r = truth["anamorphic"]["disc_radius"]
    assert abs((xs.max() - xs.min()) - (ys.max() - ys.min())) <= 2
    assert abs((ys.max() - ys.min() + 1) - 2 * r) <= 2


def test_rotated_anamorphic_source_is_upright_at_its_display_aspect(geometry, tmp_path):
    # The sample aspect is the coded picture's: stretch the width first, then turn it upright.
    src, truth = geometry
    rec = _run([src / "anamorphic_rotated.mp4"], tmp_path)["anamorphic_rotated"]
    assert (rec["width"], rec["height"], rec["source_rotation"]) == (72, 128, 90)
    ys, xs = np.nonzero(_frames(tmp_path / rec["path"])[0].mean(axis=2) > 137)
    assert abs((xs.max() - xs.min()) - (ys.max() - ys.min())) <= 2  # round, 2 radii across
    assert abs((xs.max() - xs.min() + 1) - 2 * truth["anamorphic"]["disc_radius"]) <= 2


def test_anamorphic_source_is_capped_at_max_resolution_keeping_its_display_aspect(geometry, tmp_path):
    src, _ = geometry
    rec = _run([src / "anamorphic.mp4"], tmp_path, "curation.max_resolution=100")["anamorphic"]
    assert (rec["width"], rec["height"]) == (100, 56)  # 128x72 scaled by 100/128, rounded down to even


@pytest.fixture(scope="module")
def interlaced(geometry, tmp_path_factory) -> tuple[np.ndarray, np.ndarray, dict]:
    src, truth = geometry
    woven = _frames(src / "interlaced.mp4")
    first_time = np.load(src / truth["interlaced"]["progressive"]).astype(np.float32)
    return woven, first_time, truth["interlaced"]


@pytest.mark.parametrize("method", ["bwdif", "yadif"])
def test_interlaced_source_is_deinterlaced(geometry, interlaced, tmp_path, method):
    src, _ = geometry
    woven, first_time, truth = interlaced
    rec = _run([src / "interlaced.mp4"], tmp_path, f"curation.deinterlace={method}")["interlaced"]
    assert rec["source_interlaced"] and rec["deinterlaced"] == method and not rec["interlaced"]
    clip_frames = _frames(tmp_path / rec["path"])
    assert len(clip_frames) == rec["frames"] == truth["frames"]  # one frame out per frame in
    # The woven frames' second field is half a frame late: the moving bars' edges comb. Deinterlaced, the
    # clip is the picture at its first field's time (the other lines interpolated), frame for frame.
    woven_error = np.abs(woven - first_time).mean()
    clip_error = np.abs(clip_frames - first_time).mean()
    assert clip_error < 0.5 * woven_error, (clip_error, woven_error)


def test_interlaced_source_kept_as_fields_is_recorded_so(geometry, interlaced, tmp_path):
    src, _ = geometry
    woven, first_time, _ = interlaced
    rec = _run([src / "interlaced.mp4"], tmp_path, "curation.deinterlace=none")["interlaced"]
    assert rec["source_interlaced"] and rec["interlaced"] and rec["deinterlaced"] is None
    clip_frames = _frames(tmp_path / rec["path"])  # the fields as they were: still combing
    assert np.abs(clip_frames - woven).mean() < 0.5 * np.abs(clip_frames - first_time).mean()


def test_odd_sized_source_comes_out_at_the_even_size_below(tmp_path):
    # x264 refuses odd sizes in yuv420p (the clips' format); a 4:4:4 source may have them.
    src = tmp_path / "odd.mp4"
    with av.open(str(src), "w") as c:
        s = c.add_stream("libx264", rate=24)
        s.width, s.height, s.pix_fmt = 35, 19, "yuv444p"
        for i in range(24):
            img = np.zeros((19, 35, 3), np.uint8)
            img[:, :17] = (200, 30, 30)
            img[:9] += np.uint8(2 * i)  # a slow change: one shot, not static
            f = av.VideoFrame.from_ndarray(img, format="rgb24")
            f.pts = i
            c.mux(s.encode(f))
        c.mux(s.encode(None))
    rec = _run([src], tmp_path / "out")["odd"]
    assert (rec["width"], rec["height"], rec["frames"]) == (34, 18, 24)
    assert (rec["source_width"], rec["source_height"]) == (35, 19)
    assert _frames(tmp_path / "out" / rec["path"]).shape == (24, 18, 34, 3)
