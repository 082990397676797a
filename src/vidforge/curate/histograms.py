"""Score histograms of a caption run as one PNG, with each threshold drawn as a dashed line."""

from __future__ import annotations

import math
import os
from typing import Any

from vidforge.data.manifest import atomic_path


def _values(records: list[dict[str, Any]], key: str) -> list[float]:
    out = []
    for r in records:
        v = r.get(key)
        if isinstance(v, (int, float)) and not (isinstance(v, float) and math.isnan(v)):
            out.append(float(v))
    return out


def write_histograms(records: list[dict[str, Any]], cfg: Any, path: str | os.PathLike) -> None:
    """Histograms of aesthetic, text area, motion and caption-video match over `records`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("aesthetic", "aesthetic score", [cfg.aesthetic.min_score]),
        ("text_area", "text area (largest frame fraction)", [cfg.ocr.texty_area]),
        (
            "motion",
            f"motion (px/frame at {cfg.motion.size} px)",
            [cfg.motion.min_score, cfg.motion.max_score],
        ),
        ("clip_score", "caption-video CLIP similarity", [cfg.clip_score.min_score]),
    ]
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for ax, (key, title, thresholds) in zip(axes.flat, panels, strict=True):
        values = _values(records, key)
        if values:
            ax.hist(values, bins=min(30, max(5, len(values) // 2)), color="#4477aa")
        else:
            ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes)
        for t in thresholds:
            ax.axvline(t, color="#cc3311", linestyle="--", linewidth=1)
        ax.set_title(f"{title} (n={len(values)})", fontsize=10)
        ax.set_ylabel("clips")
    kept = sum(bool(r.get("keep")) for r in records)
    fig.suptitle(f"vidforge caption: {kept} of {len(records)} clips kept")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=80, format="png")
    plt.close(fig)
