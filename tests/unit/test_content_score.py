"""The fused frame score (curate/clipping/content_score.py) is PySceneDetect's own, number for number: the
same Content and Adaptive detectors fed the same pictures give equal scores (==, not approx) and the same
cuts, on decoded sample videos (cuts, fades, a static shot) and on noise, with default, luma-only and
custom weights; with edges weighted the detector's own method runs."""

from __future__ import annotations

from fractions import Fraction

import av
import numpy as np
import pytest
from scenedetect import AdaptiveDetector, ContentDetector, FrameTimecode
from scenedetect.common import Timecode

from vidforge.curate.clipping.content_score import FusedAdaptiveDetector, FusedContentDetector
from vidforge.curate.clipping.detection_picture import DetectionPicture
from vidforge.curate.clipping.shots import detection_size


def _pictures(path) -> list[np.ndarray]:
    with av.open(str(path)) as container:
        frames = container.decode(video=0)
        first = next(frames)
        picture = DetectionPicture(detection_size(first.width, first.height))
        return [picture(first), *(picture(f) for f in frames)]


def _noise_pictures() -> list[np.ndarray]:
    """Noise, repeats (a zero score: the adaptive ratio's zero-average branch) and a jump in brightness."""
    rng = np.random.default_rng(0)
    pictures = [rng.integers(0, 256, (144, 256, 3), dtype=np.uint8) for _ in range(12)]
    pictures[4] = pictures[3]
    pictures += [pictures[-1]] * 6 + [np.full((144, 256, 3), 250, np.uint8)] * 4
    return pictures


def _run(detector, pictures) -> tuple[list, list]:
    scores, cuts = [], []
    for i, picture in enumerate(pictures):
        timecode = FrameTimecode(Timecode(pts=i, time_base=Fraction(1, 24)), fps=Fraction(24))
        cuts += [c.pts for c in detector.process_frame(timecode, picture)]
        scores.append(detector._frame_score)
    cuts += [c.pts for c in detector.post_process(timecode)]
    return scores, cuts


@pytest.mark.parametrize(
    ("theirs", "ours", "options"),
    [
        (AdaptiveDetector, FusedAdaptiveDetector, {}),
        (AdaptiveDetector, FusedAdaptiveDetector, {"luma_only": True, "window_width": 3}),
        (ContentDetector, FusedContentDetector, {}),
        (ContentDetector, FusedContentDetector, {"threshold": 12.0, "min_scene_len": 3}),
        (
            ContentDetector,
            FusedContentDetector,
            {"weights": ContentDetector.Components(0.3, 1.7, 0.9, 0.0), "threshold": 20.0},
        ),
        (ContentDetector, FusedContentDetector, {"weights": ContentDetector.Components(1.0, 1.0, 1.0, 1.0)}),
    ],
)
def test_fused_scores_and_cuts_are_pyscenedetects(sample_videos, theirs, ours, options):
    for source in ("cuts", "fade_text", "static", "noise"):
        pictures = _noise_pictures() if source == "noise" else _pictures(sample_videos / f"{source}.mp4")
        expected_scores, expected_cuts = _run(theirs(**options), pictures)
        scores, cuts = _run(ours(**options), pictures)
        assert scores == expected_scores, source
        assert cuts == expected_cuts, source
        assert any(s > 0 for s in scores), source


def test_the_static_flags_mean_difference_is_numpys():
    """decode._mean_difference (OpenCV's sum over the count) is `cv2.absdiff(a, b).mean()`, float for float:
    the static flags compare it with curation.static_threshold."""
    import cv2

    from vidforge.curate.clipping.decode import _mean_difference

    rng = np.random.default_rng(1)
    for shape in [(144, 256), (27, 48), (1, 1), (7, 3)]:
        for _ in range(200):
            a = rng.integers(0, 256, shape, dtype=np.uint8)
            b = np.clip(a + rng.integers(-3, 4, shape), 0, 255).astype(np.uint8)
            for other in (b, rng.integers(0, 256, shape, dtype=np.uint8)):
                assert _mean_difference(a, other) == cv2.absdiff(a, other).mean()
