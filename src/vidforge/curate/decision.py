"""The keep/reject decision: every clip ends with `keep` and the list of reasons it was rejected for."""

from __future__ import annotations

import math
from typing import Any

from vidforge.curate.captioners.cleaning import DEGENERATE, EMPTY
from vidforge.profile.caption import Caption

# Every reason a clip can be rejected for, in the order the summary table lists them. `error:<step>` is
# added for a step (decode, caption, enhance, aesthetic, ocr, watermark,
# motion, clip_score) that failed on the clip.
REASONS = (
    "caption_empty",
    "caption_degenerate",
    "low_aesthetic",
    "text_overlay",
    "watermark",
    "too_static",
    "too_shaky",
    "low_clip_score",
)


def _below(value: Any, threshold: float) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value)) and value < threshold


def decide(record: dict[str, Any], cfg: Caption, failed: list[str] = ()) -> list[str]:
    """Reasons to reject an annotated record (empty: keep it). `cfg` is the `curation.caption` section;
    `failed` names the steps that raised on this clip."""
    reasons = [f"error:{step}" for step in failed]
    flags = record.get("caption_flags") or []
    if cfg.reject_flagged_captions:
        reasons += [
            r for r, flag in (("caption_empty", EMPTY), ("caption_degenerate", DEGENERATE)) if flag in flags
        ]
    if cfg.aesthetic.enabled and _below(record.get("aesthetic"), cfg.aesthetic.min_score):
        reasons.append("low_aesthetic")
    if cfg.ocr.enabled and (record.get("texty_frames") or 0) > cfg.ocr.max_texty_frames:
        reasons.append("text_overlay")
    if cfg.watermark.enabled and (record.get("watermark") or 0) > cfg.watermark.max_score:
        reasons.append("watermark")
    motion = record.get("motion")
    if cfg.motion.enabled and _below(motion, cfg.motion.min_score):
        reasons.append("too_static")
    if cfg.motion.enabled and motion is not None and not math.isnan(motion) and motion > cfg.motion.max_score:
        reasons.append("too_shaky")
    if cfg.clip_score.enabled and _below(record.get("clip_score"), cfg.clip_score.min_score):
        reasons.append("low_clip_score")
    return reasons
