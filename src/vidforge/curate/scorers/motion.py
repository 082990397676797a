"""Motion score: dense optical flow between consecutive frames resized so their shorter side is `size`
pixels. A pair's score is the mean flow magnitude (pixels per frame at that size); a clip's is the mean
over its sampled pairs. Too little motion means a static clip, too much a shaky one; both thresholds live
in the profile. The flow is OpenCV Farneback on grayscale (the CPU default) or torchvision's RAFT on
colour (Vchitect-2.0's estimate; `RaftFlow`, local weights), the same units either way."""

from __future__ import annotations

import cv2
import numpy as np

from vidforge.curate.captioning.captioners import evenly_spaced

# Farneback parameters: a 3-level pyramid with 15-pixel windows follows motions of a few pixels per
# frame at 128 px; the rest are OpenCV's documented defaults.
FARNEBACK = {
    "pyr_scale": 0.5,
    "levels": 3,
    "winsize": 15,
    "iterations": 3,
    "poly_n": 5,
    "poly_sigma": 1.2,
    "flags": 0,
}


def pair_starts(num_frames: int, pairs: int) -> list[int]:
    """First frames of `pairs` evenly spaced pairs (t, t + 1) in a clip of `num_frames` frames."""
    return evenly_spaced(num_frames - 1, pairs) if num_frames >= 2 else []


def to_gray(frame: np.ndarray, size: int) -> np.ndarray:
    """RGB uint8 -> grayscale, resized so the shorter side is `size` (never upscaled)."""
    gray = cv2.cvtColor(frame, cv2.COLOR_RGB2GRAY) if frame.ndim == 3 else frame
    h, w = gray.shape
    scale = size / min(h, w)
    if scale < 1:
        gray = cv2.resize(
            gray, (max(1, round(w * scale)), max(1, round(h * scale))), interpolation=cv2.INTER_AREA
        )
    return gray


def flow_magnitude(a: np.ndarray, b: np.ndarray, size: int = 128) -> float:
    """Mean magnitude of the dense flow from frame `a` to frame `b`."""
    flow = cv2.calcOpticalFlowFarneback(to_gray(a, size), to_gray(b, size), None, **FARNEBACK)
    return float(np.linalg.norm(flow, axis=-1).mean())


def motion_score(pairs: list[tuple[np.ndarray, np.ndarray]], size: int = 128, flow=None) -> float:
    """Mean over frame pairs of the mean flow magnitude (Farneback, or `flow.magnitudes` of a RaftFlow);
    NaN without pairs (a one-frame clip)."""
    if not pairs:
        return float("nan")
    if flow is not None:
        return float(np.mean(flow.magnitudes(pairs, size)))
    return float(np.mean([flow_magnitude(a, b, size) for a, b in pairs]))


RAFT_MIN_SIDE = 128  # RAFT's correlation pyramid needs a 16x16 feature map at 1/8 scale


def raft_size(height: int, width: int, size: int) -> tuple[int, int]:
    """The size RAFT sees: the shorter side at `size` (never upscaled) but at least RAFT_MIN_SIDE, both
    sides rounded to multiples of 8 (its 1/8 feature grid)."""
    short = max(RAFT_MIN_SIDE, min(size, height, width))
    scale = short / min(height, width)
    return (
        max(RAFT_MIN_SIDE, round(height * scale / 8) * 8),
        max(RAFT_MIN_SIDE, round(width * scale / 8) * 8),
    )


class RaftFlow:
    """torchvision's RAFT (`raft_small` or `raft_large`) with weights from a local state dict file, the
    format torchvision's weight enums download. Input as torchvision's OpticalFlow preset makes it:
    RGB in [-1, 1]; the flow is the last of its refinement steps."""

    def __init__(self, method: str, weights: str, device: str = "cpu"):
        self.method, self.weights, self.device = method, weights, device
        self.model = None

    def setup(self) -> None:
        if self.model is not None:
            return
        from torchvision.models import optical_flow

        from vidforge.errors import UserInputError
        from vidforge.weights_file import load_torch_weights

        model = getattr(optical_flow, self.method)(weights=None)
        state = load_torch_weights(self.weights, "curation.caption.motion.raft_weights")
        try:
            model.load_state_dict(state)
        except RuntimeError as err:
            raise UserInputError(
                f"curation.caption.motion.raft_weights: {self.weights} is not {self.method}'s weights "
                f"({str(err).splitlines()[0]})"
            ) from None
        self.model = model.to(self.device).eval()

    def magnitudes(self, pairs: list[tuple[np.ndarray, np.ndarray]], size: int) -> list[float]:
        """Mean flow magnitude of each (a, b) pair of RGB uint8 frames, one batch."""
        import torch
        import torch.nn.functional as F

        self.setup()
        h, w = raft_size(*pairs[0][0].shape[:2], size)

        def batch(frames) -> torch.Tensor:
            x = torch.as_tensor(np.stack(frames), device=self.device).permute(0, 3, 1, 2).float()
            x = F.interpolate(x, size=(h, w), mode="bilinear", antialias=True, align_corners=False)
            return x / 127.5 - 1

        with torch.no_grad():
            flow = self.model(batch([a for a, _ in pairs]), batch([b for _, b in pairs]))[-1]
        # In pixels at `size`, as Farneback's: RAFT may have seen the frames larger (RAFT_MIN_SIDE).
        to_size = min(size, *pairs[0][0].shape[:2]) / min(h, w)
        return (flow.norm(dim=1).mean(dim=(1, 2)) * to_size).cpu().tolist()
