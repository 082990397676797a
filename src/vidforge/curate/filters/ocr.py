"""The on-screen text filter: EasyOCR on evenly spaced frames, judged by Vchitect-2.0's rule
(`curate.scorers.ocr`); clips with more than `curation.caption.ocr.max_texty_frames` texty frames are rejected."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vidforge.curate.captioning.captioners import evenly_spaced
from vidforge.curate.filters.base import Clip, Histogram, Resources, Scorer
from vidforge.errors import UserInputError
from vidforge.profile.caption import Caption, Ocr

FIELD = "curation.caption.ocr.model_dir"


class OcrFilter(Scorer):
    name = "ocr"
    Settings = Ocr
    fields = ("text_area", "texty_frames")
    reasons = ("text_overlay",)

    def check(self, cfg: Caption) -> None:
        """The folder is given and there; which files in it the languages need is EasyOCR's rule, applied
        by its own `Reader` in `setup`."""
        if not self.settings.model_dir:
            raise UserInputError(
                f"{FIELD}: give a local EasyOCR model folder (craft_mlt_25k.pth and the recogniser, e.g. "
                "english_g2.pth), or set curation.caption.ocr.enabled=false"
            )
        if not Path(self.settings.model_dir).is_dir():
            raise UserInputError(f"{FIELD}: no such folder {self.settings.model_dir}")

    def frames(self, count: int) -> set[int]:
        return set(evenly_spaced(count, self.settings.frames))

    def setup(self, resources: Resources) -> None:
        from vidforge.curate.scorers.ocr import EasyOcrDetector, TextRule

        self.detector = EasyOcrDetector(
            self.settings.model_dir, self.settings.languages, device=resources.device
        )
        self.detector.setup()
        self.rule = TextRule.from_settings(self.settings)

    def score_clip(self, clip: Clip) -> dict[str, Any]:
        from vidforge.curate.scorers.ocr import judge_text

        frames = clip.item.sample(self.settings.frames)
        verdict = judge_text(self.detector.detect_many(frames), [f.shape[:2] for f in frames], self.rule)
        return {"text_area": round(verdict.text_area, 6), "texty_frames": verdict.texty_frames}

    def reject(self, record: dict[str, Any]) -> list[str]:
        return ["text_overlay"] if (record.get("texty_frames") or 0) > self.settings.max_texty_frames else []

    def histograms(self) -> dict[str, Histogram]:
        return {"text_area": Histogram("text area (largest frame fraction)", (self.settings.texty_area,))}
