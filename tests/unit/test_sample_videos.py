"""The sample videos are what their ground truth says: checked by decoding them directly with PyAV and
by running PySceneDetect on them."""

from __future__ import annotations

import json

import av
import numpy as np
import pytest
from make_sample_videos import make_sample_videos
from scenedetect import AdaptiveDetector, detect


def _frames(path) -> list[np.ndarray]:
    with av.open(str(path)) as container:
        return [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]


def test_same_arguments_same_bytes(tmp_path, sample_videos):
    make_sample_videos(tmp_path, count=2)
    for name in ("red_square", "cuts"):
        assert (tmp_path / f"{name}.mp4").read_bytes() == (sample_videos / f"{name}.mp4").read_bytes()


def test_container_matches_truth(sample_videos, sample_truth):
    for name, truth in sample_truth.items():
        with av.open(str(sample_videos / truth["file"])) as container:
            stream = container.streams.video[0]
            assert stream.codec_context.name == "h264"
            assert stream.average_rate == truth["fps"]
            assert (stream.width, stream.height) == (truth["width"], truth["height"])
            assert sum(1 for _ in container.decode(video=0)) == truth["frames"], name


def test_adaptive_detector_finds_every_cut_and_the_false_cut(sample_videos, sample_truth):
    for name, truth in sample_truth.items():
        scenes = detect(str(sample_videos / truth["file"]), AdaptiveDetector())
        found = [start.frame_num for start, _ in scenes][1:]
        assert found == sorted(truth["cuts"] + truth["false_cuts"]), name


def test_red_square_moves_right_at_its_speed(sample_videos, sample_truth):
    truth = sample_truth["red_square"]
    motion = truth["scenes"][0]["motion"][0]
    assert (motion["colour"], motion["direction"]) == ("red", "right")
    frames = _frames(sample_videos / truth["file"])
    xs = []
    for frame in frames:
        r, g, b = (frame[..., i].astype(int) for i in range(3))
        mask = (r > 150) & (g < 90) & (b < 90)
        xs.append(np.nonzero(mask)[1].mean())
    speeds = np.diff(xs)
    assert np.allclose(speeds, motion["speed"], atol=0.35)
    assert xs[0] == pytest.approx(motion["start"][0] + (motion["size"] - 1) / 2, abs=0.6)
    caption = json.loads((sample_videos / "red_square.captions.json").read_text())
    assert caption == [{"start": 0.0, "end": 2.0, "text": "a red square moving right"}]


def test_static_span_is_frozen_and_others_move(sample_videos, sample_truth):
    truth = sample_truth["static"]
    frames = [f.astype(np.int16) for f in _frames(sample_videos / truth["file"])]
    ((start, end),) = truth["static_spans"]
    diffs = [np.abs(frames[i] - frames[i - 1]).mean() for i in range(1, len(frames))]
    assert max(diffs[start - 1 : end - 1]) < 0.5  # diffs[i-1] compares frame i with i-1
    moving = [d for i, d in enumerate(diffs, 1) if not start <= i < end and i not in truth["cuts"]]
    assert min(moving) > 0.5


def test_text_span_has_dark_text_in_its_box(sample_videos, sample_truth):
    truth = sample_truth["cuts"]
    (span,) = truth["text_spans"]
    frame = _frames(sample_videos / truth["file"])[span["start"] + 3]
    x0, y0, x1, y1 = span["box"]
    dark = frame.mean(axis=2) < 80
    assert dark[y0:y1, x0:x1].mean() > 0.15  # large text covers a good part of its box
    assert dark.sum() == pytest.approx(dark[max(0, y0 - 2) : y1 + 2, max(0, x0 - 2) : x1 + 2].sum(), rel=0.02)
    assert (x1 - x0) > 0.7 * truth["width"]


def test_captions_sidecar_and_csv(sample_videos, sample_truth):
    for name, truth in sample_truth.items():
        captions = json.loads((sample_videos / f"{name}.captions.json").read_text())
        assert [c["text"] for c in captions] == [s["caption"] for s in truth["scenes"]]
        assert captions[-1]["end"] == pytest.approx(truth["frames"] / truth["fps"])
    rows = (sample_videos / "captions.csv").read_text().splitlines()
    assert rows[0] == "path,caption" and len(rows) == len(sample_truth) + 1


def test_demo_videos_show_their_caption_in_the_tokenized_window(tmp_path):
    # `--demo N`: N videos a demo prompt, the named square whole and moving the named way at its speed in
    # the first frames (the ones tokenize keeps), from start positions that differ.
    truths = make_sample_videos(tmp_path, count=0, demo=3)
    assert len(truths) == 9
    starts = set()
    for name, truth in truths.items():
        (scene,) = truth["scenes"]
        motion = scene["motion"][0]
        assert scene["caption"] == f"a {motion['colour']} square moving {motion['direction']}", name
        frames = _frames(tmp_path / truth["file"])[:9]
        r, g, b = (np.stack(frames)[..., i].astype(int) for i in range(3))
        mask = {
            "red": (r > 150) & (g < 90) & (b < 90),
            "green": (g > 150) & (r < 90) & (b < 120),
            "white": (r > 200) & (g > 200) & (b > 200),
        }[motion["colour"]]
        axis = 1 if motion["direction"] == "right" else 0  # a frame's mask is (y, x)
        along = [np.nonzero(m)[axis].mean() for m in mask]
        assert all(m.sum() == pytest.approx(motion["size"] ** 2, rel=0.15) for m in mask), name
        assert np.allclose(np.diff(along), motion["speed"], atol=0.35), name
        # it comes in from its side (the first fifth of the frame) and crosses a third of it or more
        extent = truth["width"] if motion["direction"] == "right" else truth["height"]
        assert along[0] - motion["size"] / 2 <= 0.2 * extent + 1, name
        assert along[-1] - along[0] >= extent / 3 - 1, name
        starts.add(tuple(motion["start"]))
    assert len(starts) == 9
