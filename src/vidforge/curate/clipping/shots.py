"""Stage 2: shot detection with PySceneDetect's own detectors (or TransNetV2, `curate/clipping/transnetv2.py`, behind
the same interface), fed frame by frame from our single decode.

The frames are prepared exactly as PySceneDetect's `detect()` prepares them (BGR, downscaled by its
auto-downscale factor with linear interpolation, timestamps from the stream), so the cuts equal what
PySceneDetect reports for the same file and settings."""

from __future__ import annotations

from fractions import Fraction

import cv2
import numpy as np
from scenedetect import AdaptiveDetector, FrameTimecode
from scenedetect.common import Timecode
from scenedetect.scene_manager import compute_downscale_factor

from vidforge.curate.clipping.content_score import FusedAdaptiveDetector, FusedContentDetector
from vidforge.profile.curation import Curation


def make_detector(cfg: Curation):
    """The profile's detector; unset fields keep PySceneDetect's defaults (its Content and Adaptive
    detectors with their frame score fused: content_score.py, the same scores)."""
    if cfg.detector == "transnetv2":
        from vidforge.curate.clipping.transnetv2 import TransNetV2Detector, load_model

        model, _ = load_model(cfg.transnetv2_weights, "curation.transnetv2_weights")
        return TransNetV2Detector(model, cfg.transnetv2_threshold)
    common = {} if cfg.min_scene_len is None else {"min_scene_len": cfg.min_scene_len}
    if cfg.detector == "content":
        extra = {} if cfg.content_threshold is None else {"threshold": cfg.content_threshold}
        return FusedContentDetector(**common, **extra)
    options = {
        "adaptive_threshold": cfg.adaptive_threshold,
        "window_width": cfg.window_width,
        "min_content_val": cfg.min_content_val,
    }
    return FusedAdaptiveDetector(**common, **{k: v for k, v in options.items() if v is not None})


def detection_size(width: int, height: int) -> tuple[int, int]:
    """(width, height) PySceneDetect's auto-downscale analyses a frame of this size at."""
    factor = compute_downscale_factor(max(width, 1))
    if factor <= 1:
        return width, height
    return max(1, round(width / factor)), max(1, round(height / factor))


class ShotDetector:
    """Feeds frames to a PySceneDetect detector (from make_detector) and collects cuts with their scores."""

    def __init__(self, detector, fps: Fraction, time_base: Fraction):
        self.detector = detector
        self.fps, self.time_base = fps, time_base
        self.cuts: dict[int, float | None] = {}  # cut pts -> score
        self._last: FrameTimecode | None = None

    def feed(self, pts: int, bgr_small: np.ndarray) -> list[int]:
        """Process one frame (pts relative to the first frame); returns pts of cuts found now."""
        timecode = FrameTimecode(Timecode(pts=int(pts), time_base=self.time_base), fps=self.fps)
        self._last = timecode
        found = self.detector.process_frame(timecode, bgr_small)
        for cut in found:
            self.cuts[cut.pts] = self._score()
        return [c.pts for c in found]

    def finish(self) -> list[int]:
        if self._last is None:
            return []
        found = self.detector.post_process(self._last)
        for cut in found:
            self.cuts.setdefault(cut.pts, None)
        return [c.pts for c in found]

    def _score(self) -> float | None:
        """The score that made the cut: the adaptive ratio, or ContentDetector's content value."""
        det = self.detector
        if isinstance(det, AdaptiveDetector) and len(det._buffer) > det.window_width:
            scores = [s for _, s in det._buffer]
            target = scores[det.window_width]
            others = [s for i, s in enumerate(scores) if i != det.window_width]
            mean = sum(others) / len(others)
            return float(min(target / mean, 255.0)) if mean > 1e-5 else 255.0
        score = getattr(det, "_frame_score", None)
        return None if score is None else float(score)


def downscale(bgr: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    if (bgr.shape[1], bgr.shape[0]) == size:
        return bgr
    return cv2.resize(bgr, size, interpolation=cv2.INTER_LINEAR)
