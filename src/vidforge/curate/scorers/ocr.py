"""On-screen text: EasyOCR on sampled frames, judged by Vchitect-2.0's rule.

The rule: keep detections with confidence >= 0.4 and text of 4 characters or more; a frame is texty when
the kept boxes cover more than 2% of its area (their union, rasterised); a clip with more than one
texty frame is rejected. Every number is a profile setting (`curation.caption.ocr`). The rule works on
detector outputs alone, so it is tested without a model; `EasyOcrDetector` wraps EasyOCR loaded from a
local model folder with downloads disabled."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from vidforge.errors import UserInputError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Detection:
    box: tuple[tuple[float, float], ...]
    """Corner points (x, y) of the text box, as EasyOCR gives them."""
    text: str
    score: float


@dataclass(frozen=True)
class TextRule:
    min_confidence: float = 0.4
    min_chars: int = 4
    texty_area: float = 0.02
    max_texty_frames: int = 1

    @classmethod
    def from_settings(cls, settings: Any) -> TextRule:
        return cls(
            settings.min_confidence, settings.min_chars, settings.texty_area, settings.max_texty_frames
        )

    def kept(self, detections: Sequence[Detection]) -> list[Detection]:
        return [
            d for d in detections if d.score >= self.min_confidence and len(d.text.strip()) >= self.min_chars
        ]


def covered_fraction(boxes: Sequence[Sequence[Sequence[float]]], height: int, width: int) -> float:
    """Fraction of an `height` x `width` frame inside the union of the polygons `boxes`."""
    if not boxes or height <= 0 or width <= 0:
        return 0.0
    mask = np.zeros((height, width), np.uint8)
    for box in boxes:  # one call per polygon: a single call would apply the even-odd rule to overlaps
        cv2.fillPoly(mask, [np.round(np.asarray(box, np.float64)).astype(np.int32).reshape(-1, 2)], 1)
    return float(mask.mean())


@dataclass(frozen=True)
class TextVerdict:
    frame_areas: list[float]
    """Covered fraction of each sampled frame (kept detections only)."""
    texty_frames: int
    reject: bool

    @property
    def text_area(self) -> float:
        """The largest covered fraction over the sampled frames."""
        return max(self.frame_areas, default=0.0)


def judge_text(
    frames_detections: Sequence[Sequence[Detection]], shapes: Sequence[tuple[int, int]], rule: TextRule
) -> TextVerdict:
    """Apply the rule to a clip: per-frame detections and (height, width) of each frame."""
    areas = [
        covered_fraction([d.box for d in rule.kept(dets)], h, w)
        for dets, (h, w) in zip(frames_detections, shapes, strict=True)
    ]
    texty = sum(a > rule.texty_area for a in areas)
    return TextVerdict(areas, texty, texty > rule.max_texty_frames)


class EasyOcrDetector:
    """EasyOCR (CRAFT detector + recogniser) from a local model folder; never downloads."""

    def __init__(self, model_dir: str | None, languages: Sequence[str] = ("en",), *, device: str = "cpu"):
        self.model_dir, self.languages, self.device = model_dir, list(languages), device
        self.reader: Any = None

    def setup(self) -> None:
        if self.reader is not None:
            return
        if not self.model_dir:
            raise UserInputError(
                "curation.caption.ocr.model_dir: give a local EasyOCR model folder (craft_mlt_25k.pth and the "
                "recogniser, e.g. english_g2.pth), or set curation.caption.ocr.enabled=false"
            )
        folder = Path(self.model_dir)
        if not folder.is_dir():
            raise UserInputError(f"curation.caption.ocr.model_dir: no such folder {folder}")
        import easyocr

        try:
            self.reader = easyocr.Reader(
                self.languages,
                gpu=self.device.startswith("cuda"),
                model_storage_directory=str(folder),
                user_network_directory=str(folder),
                download_enabled=False,
                verbose=False,
            )
        except FileNotFoundError as err:  # a missing file or an MD5 mismatch, with downloads disabled
            raise UserInputError(
                f"curation.caption.ocr.model_dir: {err}; put EasyOCR's model files there"
            ) from None
        except ValueError as err:  # EasyOCR's refusal of a language (or a combination of them)
            raise UserInputError(f"curation.caption.ocr.languages {self.languages}: {err}") from None

    def detect(self, frame: np.ndarray) -> list[Detection]:
        """Detections in one RGB uint8 frame."""
        self.setup()
        results = self.reader.readtext(np.ascontiguousarray(frame))
        return [
            Detection(tuple((float(x), float(y)) for x, y in box), str(text), float(score))
            for box, text, score in results
        ]

    def detect_many(self, frames: np.ndarray) -> list[list[Detection]]:
        return [self.detect(f) for f in frames]
