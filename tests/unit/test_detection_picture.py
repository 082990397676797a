"""The detectors' picture of a frame (curate/clipping/detection_picture.py) is PySceneDetect's, bit for bit:
the whole frame to BGR by PyAV, then cv2's linear resize to the auto-downscale size. On noise, where any
difference in sampling, chroma siting or colour arithmetic shows, for sources that take the sampled path
(odd whole factors, limited and full range) and ones that do not; the sampled path must be taken where
it applies, or the fast path would go untested."""

from __future__ import annotations

import av
import cv2
import numpy as np
import pytest

from vidforge.curate.clipping.detection_picture import DetectionPicture
from vidforge.curate.clipping.shots import detection_size


def _noise_frame(width: int, height: int, fmt: str, seed: int) -> av.VideoFrame:
    frame = av.VideoFrame(width, height, fmt)
    rng = np.random.default_rng(seed)
    for plane in frame.planes:
        view = np.frombuffer(plane, np.uint8)
        view[...] = rng.integers(0, 256, view.shape, dtype=np.uint8)
    return frame


@pytest.mark.parametrize(
    ("width", "height", "fmt", "sampled"),
    [
        (1280, 720, "yuv420p", True),  # 5x on both sides
        (1280, 725, "yuv420p", None),  # 5x, odd heights: swscale converts these otherwise, either path
        (3840, 2160, "yuv420p", True),  # 15x
        (1280, 720, "yuvj420p", True),  # full range
        (1920, 1080, "yuv420p", False),  # 7.5x: linear interpolation proper
        (1024, 576, "yuv420p", False),  # 4x: even
        (1280, 720, "nv12", False),  # another layout
    ],
)
def test_detection_picture_is_pyscenedetects(width, height, fmt, sampled):
    size = detection_size(width, height)
    picture = DetectionPicture(size)
    for seed in range(3):
        frame = _noise_frame(width, height, fmt, seed)
        theirs = cv2.resize(frame.to_ndarray(format="bgr24"), size, interpolation=cv2.INTER_LINEAR)
        ours = picture(frame)
        assert ours.flags.c_contiguous and ours.shape == (size[1], size[0], 3)
        np.testing.assert_array_equal(ours, theirs)
    assert sampled is None or picture.sampled == sampled
