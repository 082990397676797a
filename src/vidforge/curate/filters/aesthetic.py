"""The aesthetic filter: LAION's aesthetic head on the clip's CLIP image embeddings (`curate.scorers.aesthetic`),
the mean over frames; clips below `curation.caption.aesthetic.min_score` are rejected."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vidforge.curate.filters.base import (
    RANDOM_HINT,
    Clip,
    Histogram,
    Resources,
    Scorer,
    below,
    finite,
    open_clip_config,
    tensor_shapes,
)
from vidforge.data.embeddings import AESTHETIC
from vidforge.errors import UserInputError
from vidforge.profile.caption import Aesthetic, Caption

FIELD = "curation.caption.aesthetic.head"


def head_width(path: str) -> int | None:
    """The input width of the aesthetic head in the file at `path`, from its header; None when the header
    does not read (the loader in `setup` then says why)."""
    file = Path(path)
    if not file.is_file():
        raise UserInputError(f"{FIELD}: no such file {file}")
    try:
        shapes = tensor_shapes(file)
    except Exception:  # noqa: BLE001 - an unreadable or legacy-format file: setup's loader decides
        return None
    first = shapes.get("layers.0.weight")
    if first is None or len(first) != 2:
        raise UserInputError(f"{FIELD}: {file} is not a LAION aesthetic head (no layers.0.weight)")
    return int(first[1])


class AestheticFilter(Scorer):
    name = "aesthetic"
    Settings = Aesthetic
    fields = (AESTHETIC,)
    store_fields = (AESTHETIC,)
    reasons = ("low_aesthetic",)
    uses_clip = True

    def check(self, cfg: Caption) -> None:
        if self.settings.head is None:
            if not cfg.random_weights:
                raise UserInputError(
                    f"{FIELD}: give the local LAION aesthetic head (e.g. sac+logos+ava1-l14-linearMSE.pth), "
                    f"set curation.caption.aesthetic.enabled=false, {RANDOM_HINT}"
                )
            return
        width = head_width(self.settings.head)
        clip = open_clip_config(
            cfg.clip.model, cfg.clip.checkpoint, cfg.random_weights, "curation.caption.clip"
        )
        clip_width = None if clip is None else clip.get("embed_dim")
        if width is not None and clip_width is not None and width != clip_width:
            raise UserInputError(
                f"{FIELD} expects {width}-wide CLIP embeddings but curation.caption.clip.model "
                f"({cfg.clip.model}) gives {clip_width}; use ViT-L-14 for the LAION head"
            )

    def setup(self, resources: Resources) -> None:
        from vidforge.curate.scorers.aesthetic import AestheticScorer

        self.model = AestheticScorer(
            self.settings.head, device=resources.device, random_weights=resources.random_weights
        )
        self.model.setup(embedding_width=resources.embedder.width)
        self.random_weights = self.model.random_weights

    def score_clip(self, clip: Clip) -> dict[str, Any]:
        if clip.embeddings is None:
            return {}
        return {AESTHETIC: finite(self.model.score_clip(clip.embeddings))}

    def reject(self, record: dict[str, Any]) -> list[str]:
        return ["low_aesthetic"] if below(record.get("aesthetic"), self.settings.min_score) else []

    def histograms(self) -> dict[str, Histogram]:
        return {"aesthetic": Histogram("aesthetic score", (self.settings.min_score,))}
