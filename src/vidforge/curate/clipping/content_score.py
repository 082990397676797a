"""PySceneDetect's Content and Adaptive detectors with their frame score taken in two OpenCV calls.

ContentDetector scores a frame by the mean absolute difference of its hue, saturation and value planes from
the previous frame's: it splits the HSV picture and, per plane, widens both to int32, subtracts, takes
the absolute value and sums (~0.17 ms a 256x144 picture, a fifth of `vidforge clip`'s Python per frame).
`cv2.absdiff` of the two HSV pictures and `cv2.sumElems` give the same three integer sums (exact in a
double), which are divided and weighted in the same order as PySceneDetect does it, so every score, and
so every cut, is the same number (tests/unit/test_content_score.py compares them frame by frame). With
edges weighted or a stats manager attached, the detector's own method runs."""

from __future__ import annotations

import cv2
import numpy as np
from scenedetect import AdaptiveDetector, ContentDetector


class _FusedScore:
    """Replaces `ContentDetector._calculate_frame_score` where edges play no part."""

    _last_hsv: np.ndarray | None = None

    def _calculate_frame_score(self, timecode, frame_img: np.ndarray) -> float:
        weights = self._weights
        if weights.delta_edges > 0.0 or self.stats_manager is not None:
            return super()._calculate_frame_score(timecode, frame_img)
        hsv = cv2.cvtColor(frame_img, cv2.COLOR_BGR2HSV)
        last, self._last_hsv = self._last_hsv, hsv
        if last is None:
            return 0.0  # PySceneDetect's score of the first frame
        hue, sat, lum, _ = cv2.sumElems(cv2.absdiff(hsv, last))
        pixels = float(hsv.shape[0] * hsv.shape[1])
        components = ContentDetector.Components(
            delta_hue=hue / pixels, delta_sat=sat / pixels, delta_lum=lum / pixels, delta_edges=0.0
        )
        return sum(c * w for c, w in zip(components, weights, strict=True)) / sum(abs(w) for w in weights)


class FusedContentDetector(_FusedScore, ContentDetector):
    """`ContentDetector`, its frame score fused."""


class FusedAdaptiveDetector(_FusedScore, AdaptiveDetector):
    """`AdaptiveDetector` (whose ratio is taken over ContentDetector's scores), its frame score fused."""
