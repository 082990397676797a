"""Watermark filter (Vchitect-2.0): LAION's watermark classifier on a clip's first, middle and last frames.

The classifier (LAION-AI/LAION-5B-WatermarkDetection, `watermark_model_v1.pt`) is a timm EfficientNet-B3
whose head is replaced by 1536 -> 625 -> ReLU -> Dropout(0.3) -> 256 -> ReLU -> 2; its published file is
that model's state dict, loaded here as it is (timm's `efficientnet_b3` has the same modules as the
`efficientnet_b3a` LAION trained, which newer timm no longer names). Images are resized to 256x256 and
normalised with ImageNet's mean and std; the softmax's first class is "watermark". A clip's score is the
highest of its frames' (a logo in any of them is one in the clip)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from vidforge.errors import UserInputError
from vidforge.weights_file import load_torch_weights

FIELD = "curation.caption.watermark"
SIZE = 256
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def build_model(backbone: str = "efficientnet_b3") -> nn.Module:
    """LAION's architecture with random weights (load a state dict into it)."""
    import timm

    model = timm.create_model(backbone, pretrained=False, num_classes=2)
    model.classifier = nn.Sequential(
        nn.Linear(model.classifier.in_features, 625),
        nn.ReLU(),
        nn.Dropout(p=0.3),
        nn.Linear(625, 256),
        nn.ReLU(),
        nn.Linear(256, 2),
    )
    return model


def load_model(settings, *, random_weights: bool, device: str) -> tuple[nn.Module, bool]:
    """The classifier with weights from `settings.weights` (a state dict file, as LAION publishes it);
    without a path, random weights if allowed (True as the second value), else a UserInputError."""
    model = build_model(settings.backbone)
    if settings.weights is None:
        if not random_weights:
            raise UserInputError(
                f"{FIELD}.weights: give the local LAION watermark model (watermark_model_v1.pt), set "
                f"{FIELD}.enabled=false, or curation.caption.random_weights=true (tests and demos only)"
            )
        return model.to(device).eval(), True
    file = Path(settings.weights)
    if not file.is_file():
        raise UserInputError(f"{FIELD}.weights: no such file {file}")
    state = load_torch_weights(file, f"{FIELD}.weights")
    try:
        model.load_state_dict(state)
    except RuntimeError as err:
        first = str(err).splitlines()[0]
        raise UserInputError(
            f"{FIELD}.weights: {file} is not a LAION watermark model for {settings.backbone} ({first})"
        ) from None
    return model.to(device).eval(), False


class WatermarkClassifier:
    def __init__(self, settings, *, device: str = "cpu", random_weights: bool = False):
        self.settings, self.device, self.random_allowed = settings, device, random_weights
        self.model: nn.Module | None = None
        self.random_weights = False

    def setup(self) -> None:
        if self.model is None:
            self.model, self.random_weights = load_model(
                self.settings, random_weights=self.random_allowed, device=self.device
            )

    @torch.no_grad()
    def probabilities(self, frames: np.ndarray) -> np.ndarray:
        """(N, H, W, 3) RGB uint8 -> (N,) probability of a watermark."""
        self.setup()
        x = torch.as_tensor(frames, device=self.device).permute(0, 3, 1, 2).float() / 255
        # torchvision's Resize((256, 256)) on images: bilinear with antialiasing.
        x = F.interpolate(x, size=(SIZE, SIZE), mode="bilinear", antialias=True, align_corners=False)
        mean = torch.tensor(MEAN, device=self.device).view(1, 3, 1, 1)
        std = torch.tensor(STD, device=self.device).view(1, 3, 1, 1)
        logits = self.model((x - mean) / std)
        return F.softmax(logits, dim=1)[:, 0].cpu().numpy()

    def score_clip(self, frames: np.ndarray) -> float:
        return float(self.probabilities(frames).max())
