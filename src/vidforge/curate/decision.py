"""The keep/reject decision: every clip ends with `keep` and the list of reasons it was rejected for."""

from __future__ import annotations

from typing import Any

from vidforge.curate import filters
from vidforge.curate.captioning.captioners.cleaning import DEGENERATE, EMPTY
from vidforge.profile.caption import Caption

CAPTION_REASONS = ("caption_empty", "caption_degenerate")


def reasons() -> tuple[str, ...]:
    """Every reason a clip can be rejected for, in the order the summary table lists them: the caption's,
    then each scorer's in registry order. `error:<step>` is added for a step (decode, caption, enhance or
    a scorer's name) that failed on the clip."""
    return CAPTION_REASONS + filters.reasons()


def decide(record: dict[str, Any], cfg: Caption, failed: list[str] = ()) -> list[str]:
    """Reasons to reject an annotated record (empty: keep it). `cfg` is the `curation.caption` section;
    `failed` names the steps that raised on this clip."""
    out = [f"error:{step}" for step in failed]
    flags = record.get("caption_flags") or []
    if cfg.reject_flagged_captions:
        out += [r for r, flag in zip(CAPTION_REASONS, (EMPTY, DEGENERATE), strict=True) if flag in flags]
    for scorer in filters.enabled(cfg):
        out += scorer.reject(record)
    return out
