"""The caption-video match: cosine similarity of the caption's CLIP text embedding and the clip's frame
embeddings, averaged over frames (`curate.scorers.clip_score`); clips below
`curation.caption.clip_score.min_score` are rejected."""

from __future__ import annotations

from typing import Any

from vidforge.curate.filters.base import Clip, Histogram, Scorer, below, finite
from vidforge.profile.caption import ClipScore


class ClipScoreFilter(Scorer):
    name = "clip_score"
    Settings = ClipScore
    fields = ("clip_score",)
    reasons = ("low_clip_score",)
    uses_clip = True
    reads_text = True

    def score_clip(self, clip: Clip) -> dict[str, Any]:
        from vidforge.curate.scorers.clip_score import clip_similarity

        if clip.embeddings is None or clip.text_embedding is None:
            return {}
        return {"clip_score": finite(clip_similarity(clip.embeddings, clip.text_embedding))}

    def reject(self, record: dict[str, Any]) -> list[str]:
        return ["low_clip_score"] if below(record.get("clip_score"), self.settings.min_score) else []

    def histograms(self) -> dict[str, Histogram]:
        return {"clip_score": Histogram("caption-video CLIP similarity", (self.settings.min_score,))}
