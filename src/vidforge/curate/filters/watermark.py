"""The watermark filter (Vchitect-2.0): LAION's watermark classifier on evenly spaced frames
(`curate.scorers.watermark`), the highest frame's probability; clips above
`curation.caption.watermark.max_score` are rejected."""

from __future__ import annotations

from typing import Any

from vidforge.curate.captioning.captioners import evenly_spaced
from vidforge.curate.filters.base import Clip, Histogram, Resources, Scorer, check_weights_file
from vidforge.profile.caption import Caption, Watermark


class WatermarkFilter(Scorer):
    name = "watermark"
    Settings = Watermark
    fields = ("watermark",)
    reasons = ("watermark",)

    def check(self, cfg: Caption) -> None:
        check_weights_file(self.settings.weights, cfg.random_weights, "curation.caption.watermark.weights")

    def frames(self, count: int) -> set[int]:
        return set(evenly_spaced(count, self.settings.frames))

    def setup(self, resources: Resources) -> None:
        from vidforge.curate.scorers.watermark import WatermarkClassifier

        self.model = WatermarkClassifier(
            self.settings, device=resources.device, random_weights=resources.random_weights
        )
        self.model.setup()
        self.random_weights = self.model.random_weights

    def score_clip(self, clip: Clip) -> dict[str, Any]:
        return {"watermark": round(self.model.score_clip(clip.item.sample(self.settings.frames)), 6)}

    def reject(self, record: dict[str, Any]) -> list[str]:
        return ["watermark"] if (record.get("watermark") or 0) > self.settings.max_score else []

    def histograms(self) -> dict[str, Histogram]:
        return {"watermark": Histogram("watermark probability (highest frame)", (self.settings.max_score,))}
