"""The curation filters of `vidforge caption`, one scorer each (`base.Scorer`), in the order they run,
their fields are listed and their reasons counted. A new filter is a module here and a line in
`REGISTRY`; give it a section in `profile/caption.py` (`Caption`) to make its settings profile settings
(without one it runs with its `Settings()` defaults)."""

from __future__ import annotations

from vidforge.curate.filters.aesthetic import AestheticFilter
from vidforge.curate.filters.base import Clip, Histogram, Resources, Scorer
from vidforge.curate.filters.clip_score import ClipScoreFilter
from vidforge.curate.filters.motion import MotionFilter
from vidforge.curate.filters.ocr import OcrFilter
from vidforge.curate.filters.watermark import WatermarkFilter
from vidforge.profile.caption import Caption

REGISTRY: list[type[Scorer]] = [
    AestheticFilter,
    OcrFilter,
    WatermarkFilter,
    MotionFilter,
    ClipScoreFilter,
]


def scorers(cfg: Caption) -> list[Scorer]:
    """Every registered scorer with its settings from `cfg` (`curation.caption`), enabled or not."""
    return [cls(cls.settings_of(cfg)) for cls in REGISTRY]


def enabled(cfg: Caption) -> list[Scorer]:
    """The scorers `cfg` turns on, in registry order (none loaded: `setup` does that)."""
    return [s for s in scorers(cfg) if s.enabled]


def fields() -> tuple[str, ...]:
    """Every record field some scorer writes."""
    return tuple(f for cls in REGISTRY for f in cls.fields)


def reasons() -> tuple[str, ...]:
    """Every reason some scorer rejects a clip for."""
    return tuple(r for cls in REGISTRY for r in cls.reasons)


def names() -> tuple[str, ...]:
    return tuple(cls.name for cls in REGISTRY)


__all__ = ["REGISTRY", "Clip", "Histogram", "Resources", "Scorer", "enabled", "fields", "reasons", "scorers"]
