"""The demo's prompt tracker against the sample generator's ground truth (truth.json: each shape's start
and velocity), and against frames drawn here with a known path."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vidforge.bench.prompt_track import decode, parse_prompt, track


def test_tracker_matches_the_generator_truth_on_each_demo_colour(sample_videos) -> None:
    truth = json.loads((sample_videos / "truth.json").read_text())
    seen = set()
    for name, video in truth.items():
        frames = decode(sample_videos / video["file"])
        for scene in video["scenes"]:
            try:
                parse_prompt(scene["caption"])
            except ValueError:
                continue
            shape = scene["motion"][0]
            part = frames[scene["start"] : scene["end"]]
            tr = track(part, scene["caption"])
            horizontal = tr.direction in ("right", "left")
            extent = part.shape[2] if horizontal else part.shape[1]
            expected = abs(shape["dx"] if horizontal else shape["dy"]) * (len(part) - 1) / extent
            # false_split's two-frame camera flash washes the green out of those frames.
            assert tr.visible >= 0.9, (name, scene["caption"])
            assert tr.travel == pytest.approx(expected, abs=2 / extent), (name, scene["caption"])
            seen.add(shape["colour"])
    assert seen == {"red", "green", "white"}


def test_tracker_scores_the_wrong_way_negative_and_an_absent_colour_zero() -> None:
    frames = np.zeros((9, 32, 48, 3), np.uint8)
    for t in range(9):  # a red 6-px square moving left 2 px a frame
        frames[t, 10:16, 30 - 2 * t : 36 - 2 * t] = (220, 30, 30)
    right = track(frames, "a red square moving right")
    assert right.visible == 1.0 and right.travel == pytest.approx(-16 / 48)
    assert track(frames, "a green square moving right").visible == 0.0
    with pytest.raises(ValueError, match="not a demo prompt"):
        parse_prompt("a cat walks on the grass")


def test_scattered_colour_is_no_blob_and_a_blob_in_sparse_noise_is_followed() -> None:
    # Red pixels on every 4th row and column (isolated, as an undertrained model's noise scatters them):
    # no patch holds a quarter of them, so no frame shows the square, however many there are.
    frames = np.zeros((9, 32, 48, 3), np.uint8)
    frames[:, ::4, ::4] = (220, 30, 30)
    assert track(frames, "a red square moving right").visible == 0.0
    # A 6-px red square moving right 2 px a frame, among 12 stray red pixels (36 of 48 in the blob):
    # its own path, not the strays' centroid.
    frames = np.zeros((9, 32, 48, 3), np.uint8)
    frames[:, 30, ::4] = (220, 30, 30)
    for t in range(9):
        frames[t, 4:10, 2 + 2 * t : 8 + 2 * t] = (220, 30, 30)
    right = track(frames, "a red square moving right")
    assert right.visible == 1.0 and right.travel == pytest.approx(16 / 48)


def test_a_frame_washed_in_the_colour_is_not_a_square_of_it() -> None:
    # Most of every frame white with a few dark specks, the "square" drifting down by the specks' motion:
    # what a failed student drew for "a white square moving down".
    frames = np.full((9, 32, 48, 3), 230, np.uint8)
    for t in range(9):
        frames[t, 2 + 3 * t : 4 + 3 * t, 5:7] = 20
        frames[t, :2, :] = 20  # the top rows dark, so the white patch's centroid moves as little as it may
    assert track(frames, "a white square moving down").visible == 0.0
    frames[:] = 20
    for t in range(9):  # the same frames with a real 16 x 16 white square moving down: seen
        frames[t, 2 * t : 2 * t + 16, 16:32] = 230
    tr = track(frames, "a white square moving down")
    assert tr.visible == 1.0 and tr.travel == pytest.approx(16 / 32, abs=0.02)
