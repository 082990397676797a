"""Motion score: Farneback flow magnitude recovers a known whole-frame shift, and orders the sample
videos' static, slow and fast clips as their ground truth does."""

from __future__ import annotations

import av
import cv2
import numpy as np
import pytest

from vidforge.curate.scorers.motion import flow_magnitude, motion_score, pair_starts


def _texture(h=192, w=256, seed=0):
    noise = np.random.default_rng(seed).integers(0, 256, (h // 8, w // 8, 3), dtype=np.uint8)
    return cv2.GaussianBlur(cv2.resize(noise, (w, h), interpolation=cv2.INTER_CUBIC), (5, 5), 1.5)


@pytest.mark.parametrize("shift", [1, 2, 3])
def test_flow_recovers_a_known_shift(shift):
    big = _texture(192, 256 + 16)
    a, b = big[:, 8 : 8 + 256], big[:, 8 - shift : 8 - shift + 256]  # content moves right by `shift`
    # At size=192 (no resize) the magnitude is the shift; at 96 it is half of it.
    assert flow_magnitude(a, b, size=192) == pytest.approx(shift, rel=0.15)
    assert flow_magnitude(a, b, size=96) == pytest.approx(shift / 2, rel=0.2)
    assert flow_magnitude(a, a, size=192) < 0.01


def test_pair_starts():
    assert pair_starts(10, 3) == [0, 4, 8]  # pairs (0,1), (4,5), (8,9)
    assert pair_starts(1, 4) == [] and motion_score([]) != motion_score([])  # NaN


def _decode(path):
    with av.open(str(path)) as container:
        return [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]


def test_motion_orders_static_slow_fast(sample_videos, sample_truth):
    scores, speeds = {}, {}
    for name in ("motion_static", "motion_slow", "motion_fast"):
        frames = _decode(sample_videos / sample_truth[name]["file"])
        pairs = [(frames[t], frames[t + 1]) for t in pair_starts(len(frames), 4)]
        scores[name] = motion_score(pairs, size=128)
        speeds[name] = max(m["speed"] for s in sample_truth[name]["scenes"] for m in s["motion"])
    by_truth = sorted(scores, key=speeds.get)
    assert by_truth == ["motion_static", "motion_slow", "motion_fast"]
    assert sorted(scores, key=scores.get) == by_truth
    assert scores["motion_static"] < 0.05 < scores["motion_slow"]  # the default too_static threshold
