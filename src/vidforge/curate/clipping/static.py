"""Stage 5: the static filter (after Vchitect-2.0). A frame is static when its greyscale mean absolute
difference to the previous frame is below `curation.static_threshold` (flags computed while decoding);
a clip whose share of static frames exceeds `curation.static_max_ratio` is dropped."""

from __future__ import annotations

import numpy as np


def static_ratio(static: np.ndarray, start: int, end: int) -> float:
    """Share of static frames in [start, end). The clip's first frame is compared with the frame before
    it, which may belong to another shot, so it is left out."""
    span = static[start + 1 : end]
    return float(span.mean()) if len(span) else 0.0


def static_reason(ratio: float, max_ratio: float) -> str | None:
    if ratio > max_ratio:
        return f"static ratio {ratio:.2f} exceeds curation.static_max_ratio={max_ratio}"
    return None
