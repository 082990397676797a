"""Plots of bench results (matplotlib, drawn off-screen). matplotlib is optional: without it the plot is
skipped and the caller is told why; the CSV and JSON beside it hold the same numbers."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vidforge.files import atomic_path


def _number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def plot_sweep(
    rows: Sequence[dict[str, Any]], keys: Sequence[str], path: str | Path, y: str = "tokens_per_s"
) -> tuple[str | None, str | None]:
    """Throughput against context length (tokens per sample), one line per combination of the other
    grid fields (e.g. per layout). Returns (path, None), or (None, why not)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None, "matplotlib is not installed (pip install matplotlib): plot skipped; see the CSV"
    fig = sweep_figure(rows, keys, y)
    if fig is None:
        return None, "no point succeeded: nothing to plot"
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)
    return str(path), None


def sweep_figure(rows: Sequence[dict[str, Any]], keys: Sequence[str], y: str = "tokens_per_s"):
    """The sweep plot's matplotlib figure (None when no point succeeded); `plot_sweep` saves it."""
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r.get("ok") and _number(r.get(y)) is not None]
    if not ok:
        return None
    x = "tokens_per_sample"
    lines: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in ok:
        varying = [k for k in keys if "latent" not in k and "text_tokens" not in k]
        label = ", ".join(f"{k}={r.get(k)}" for k in varying) or str(r.get("layout", ""))
        lines[label].append((float(r.get(x) or 0), float(r[y])))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, points in sorted(lines.items()):
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
    ax.set_xlabel("tokens per sample (context length)")
    ax.set_ylabel(y.replace("_", " "))
    # From zero: matplotlib fits the axis to the data, so two layouts 5% apart looked twice as fast.
    ax.set_ylim(bottom=0)
    ax.set_title("vidforge bench sweep")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
