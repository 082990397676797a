"""A decoded frame as the shot detectors see it: BGR at PySceneDetect's detection size, bit for bit what
`shots.downscale(frame.to_ndarray(format="bgr24"), size)` gives, usually without converting the whole frame.

When the frame shrinks by an odd whole factor k on both sides (1280x720 and 3840x2160 to 256x144), cv2's
linear resize reads each detection pixel from one source pixel, at (i + 0.5) * k - 0.5, with weight 1,
so only those are needed: their luma and their
chroma samples go into a small yuv420p frame, each at the top left of its own 2x2 block (so no two share
a chroma sample), and swscale's converter, which maps every pixel from its own luma and chroma, turns that
into BGR. Converting a sixteenth of the pixels this way costs ~0.3 ms a 720p frame against ~0.65 ms.
Whether this swscale build's converter at these sizes really is per pixel is checked once per source on
a noise frame against the whole-frame path; any difference keeps the whole-frame path."""

from __future__ import annotations

import av
import cv2
import numpy as np
from av.video.reformatter import VideoReformatter

from vidforge.curate.clipping.shots import downscale

SAMPLED_FORMATS = ("yuv420p", "yuvj420p")  # 8-bit 4:2:0 planar: one luma byte, one chroma sample per 2x2


class DetectionPicture:
    """`picture(frame)`: the detection-size BGR array of a decoded frame of one source."""

    def __init__(self, size: tuple[int, int]):
        self.size = size
        self._whole = VideoReformatter()  # one swscale context per source, not one per frame (10x faster)
        self._sampler: _Sampler | None = None
        self._checked = False

    @property
    def sampled(self) -> bool:
        """Whether this source's frames take the sampled path (known after the first frame)."""
        return self._sampler is not None

    def __call__(self, frame: av.VideoFrame) -> np.ndarray:
        if not self._checked:
            self._checked = True
            self._sampler = _Sampler.for_frame(frame, self.size)
            if self._sampler is not None and not self._sampler.agrees(frame, self.whole):
                self._sampler = None
        if self._sampler is not None:
            return self._sampler(frame)
        return self.whole(frame)

    def whole(self, frame: av.VideoFrame) -> np.ndarray:
        """The reference: the whole frame to BGR, then PySceneDetect's resize."""
        return downscale(self._whole.reformat(frame, format="bgr24").to_ndarray(), self.size)


class _Sampler:
    """The sampled path for frames of one size, format and colour description."""

    def __init__(self, k: tuple[int, int], size: tuple[int, int], fmt: str):
        (self.kx, self.ky), (self.w, self.h) = k, size
        self.small = av.VideoFrame(2 * self.w, 2 * self.h, fmt)  # yuvj420p says full range by its name
        self._to_bgr = VideoReformatter()

    @classmethod
    def for_frame(cls, frame: av.VideoFrame, size: tuple[int, int]) -> _Sampler | None:
        if frame.format.name not in SAMPLED_FORMATS:
            return None
        kx, ky = _odd_factor(frame.width, size[0]), _odd_factor(frame.height, size[1])
        return cls((kx, ky), size, frame.format.name) if kx > 1 and ky > 1 else None

    def __call__(self, frame: av.VideoFrame) -> np.ndarray:
        w, h, kx, ky = self.w, self.h, self.kx, self.ky
        ox, oy = (kx - 1) // 2, (ky - 1) // 2  # the source pixel detection pixel 0 reads
        luma, small = _plane(frame.planes[0]), self.small
        _plane(small.planes[0])[0 : 2 * h : 2, 0 : 2 * w : 2] = luma[oy::ky, ox::kx][:h, :w]
        for i in (1, 2):
            # Detection pixel x reads chroma column (kx * x + ox) // 2: kx * m + ox // 2 for x = 2m and
            # kx * m + (kx + ox) // 2 for x = 2m + 1; rows alike. Four strided copies, no index arrays.
            src, dst = _plane(frame.planes[i]), _plane(small.planes[i])
            for row_parity, row0 in ((0, oy // 2), (1, (ky + oy) // 2)):
                for col_parity, col0 in ((0, ox // 2), (1, (kx + ox) // 2)):
                    part = dst[row_parity:h:2, col_parity:w:2]
                    part[...] = src[row0::ky, col0::kx][: part.shape[0], : part.shape[1]]
        small.colorspace, small.color_range = frame.colorspace, frame.color_range
        bgr = self._to_bgr.reformat(small, format="bgr24").to_ndarray()
        # Every second pixel of every second row: cv2's nearest resize by exactly 2 reads pixel 2i, and
        # copies 3-byte pixels 4x faster than numpy's strided copy.
        return cv2.resize(bgr, (w, h), interpolation=cv2.INTER_NEAREST)

    def agrees(self, frame: av.VideoFrame, whole) -> bool:
        """Both paths give the same array on a noise frame shaped and described like `frame`."""
        noise = av.VideoFrame(frame.width, frame.height, frame.format.name)
        rng = np.random.default_rng(0)
        for plane in noise.planes:
            view = _plane(plane)
            view[...] = rng.integers(0, 256, view.shape, dtype=np.uint8)
        noise.colorspace, noise.color_range = frame.colorspace, frame.color_range
        return np.array_equal(self(noise), whole(noise))


def _plane(plane) -> np.ndarray:
    """A frame plane as a writable (rows, line size) uint8 array over its buffer."""
    return np.frombuffer(plane, np.uint8).reshape(-1, plane.line_size)


def _odd_factor(source: int, target: int) -> int:
    """k when source == k * target for an odd k, else 0."""
    k, rest = divmod(source, target)
    return k if rest == 0 and k % 2 == 1 else 0
