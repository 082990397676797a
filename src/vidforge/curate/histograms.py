"""Score histograms of a caption run as one PNG: a panel per measured score, each threshold a labelled
dashed line. A score nothing measured (its step off in the profile) gets no panel rather than an empty
one, and each panel's x axis spans its data: a threshold beyond the data (a filter set wide open, e.g.
aesthetic.min_score=-1000) would squash the histogram into a sliver, so it is named in the panel's
corner with an arrow pointing where it lies instead of being drawn."""

from __future__ import annotations

import math
import os
from typing import Any

from vidforge.curate import filters
from vidforge.curate.filters import Histogram
from vidforge.data.manifest import atomic_path
from vidforge.profile.caption import Caption
from vidforge.profile.curation import Curation


def _values(records: list[dict[str, Any]], key: str) -> list[float]:
    out = []
    for r in records:
        v = r.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v):
            out.append(float(v))
    return out


def thresholds(cfg: Caption) -> dict[str, list[float]]:
    """The keep/reject thresholds of each score under the `curation.caption` section `cfg`, by record key,
    from every scorer (caption.py records them in summary.json, so that a review of the run draws the ones
    it used)."""
    return {k: list(h.thresholds) for k, h in _panels(cfg).items()}


def titles(cfg: Caption) -> dict[str, str]:
    """Panel titles of a caption run's scores under `cfg`, by record key (recorded in summary.json too)."""
    return {k: h.title for k, h in _panels(cfg).items()}


def _panels(cfg: Caption) -> dict[str, Histogram]:
    return {k: h for s in filters.scorers(cfg) for k, h in s.histograms().items()}


def clip_thresholds(cfg: Curation) -> dict[str, list[float]]:
    """The thresholds `vidforge clip` keeps or drops a clip by, under the `curation` section `cfg`, by
    record key (clip.py records them in its summary.json)."""
    return {"static_ratio": [cfg.static_max_ratio], "duration_s": [cfg.min_seconds, cfg.max_seconds]}


# Panel titles of a clip run's scores, by record key.
CLIP_TITLES = {
    "duration_s": "clip duration (s)",
    "static_ratio": "fraction of static frames",
    "shot_score": "shot detector score at the cut",
}


def write_histograms(records: list[dict[str, Any]], cfg: Caption, path: str | os.PathLike) -> bool:
    """Histograms of the measured scores over `records` under the `curation.caption` section `cfg`."""
    return draw_histograms(records, thresholds(cfg), titles(cfg), path)


def draw_histograms(
    records: list[dict[str, Any]],
    limits: dict[str, list[float]],
    names: dict[str, str],
    path: str | os.PathLike,
) -> bool:
    """`histogram_figure` as a PNG at `path`. Returns False (and writes nothing) when nothing was measured."""
    fig = histogram_figure(records, limits, names)
    if fig is None:
        return False
    import matplotlib.pyplot as plt

    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=80, format="png")
    plt.close(fig)
    return True


def histogram_figure(records: list[dict[str, Any]], limits: dict[str, list[float]], names: dict[str, str]):
    """One panel per score in `names` that some record has a value for, with `limits[score]` marked; None
    when no score was measured at all."""
    measured = [(key, _values(records, key)) for key in names]
    measured = [(key, values) for key, values in measured if values]
    if not measured:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(2, len(measured))
    rows = math.ceil(len(measured) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.3 * rows), squeeze=False)
    for ax, (key, values) in zip(axes.flat, measured, strict=False):
        _panel(ax, values, limits.get(key, []), f"{names[key]} (n={len(values)})")
    for ax in list(axes.flat)[len(measured) :]:
        ax.remove()
    kept = sum(bool(r.get("keep")) for r in records)
    fig.suptitle(f"{kept} of {len(records)} clips kept")
    fig.tight_layout()
    return fig


def _panel(ax, values: list[float], limits: list[float], title: str) -> None:
    from matplotlib.ticker import MaxNLocator

    lo, hi = min(values), max(values)
    pad = (hi - lo) * 0.05 or max(abs(lo) * 0.05, 1e-3)
    lo, hi = lo - pad, hi + pad
    counts, _, _ = ax.hist(values, bins=min(30, max(5, len(values) // 2)), range=(lo, hi), color="#4477aa")
    ax.set_ylim(0, max(counts) * 1.25)  # headroom for the threshold labels above the bars
    below = [f"← threshold {t:g}" for t in limits if t < lo]
    above = [f"threshold {t:g} →" for t in limits if t > hi]
    for t in limits:
        if lo <= t <= hi:
            ax.axvline(t, color="#cc3311", linestyle="--", linewidth=1)
            ax.annotate(
                f"threshold {t:g}",
                (t, 1),
                xycoords=("data", "axes fraction"),
                xytext=(3, -3),
                textcoords="offset points",
                va="top",
                fontsize=8,
                color="#cc3311",
            )
    for text, x, ha in (("\n".join(below), 0.01, "left"), ("\n".join(above), 0.99, "right")):
        if text:
            box = {"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1}
            ax.text(
                x, 0.97, text, ha=ha, va="top", transform=ax.transAxes, fontsize=8, color="#cc3311", bbox=box
            )
    # Few ticks (scores of random-weight models differ in the 4th digit) and whole numbers of clips.
    ax.xaxis.set_major_locator(MaxNLocator(5))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlim(lo, hi)
    ax.set_title(title, fontsize=10)
    ax.set_ylabel("clips")
