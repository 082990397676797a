"""The review of a training run: curves from metrics.jsonl (loss with the loss per noise level, learning
rate, gradient norm, step time, MFU) and the validation samples. The loss per noise level is whatever
`loss_<level>_<lo>-<hi>` keys the objective logged (`vidforge.train.metrics.LossByLevel`: sigma for EDM,
t for flow)."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import yaml

from vidforge.data.manifest import read_jsonl
from vidforge.files import atomic_path
from vidforge.review.page import Page
from vidforge.review.samples import validation_items

# `loss_sigma_0.1-0.5`, `loss_t_0-0.2`: the objective's noise coordinate, then the bucket's bounds.
LEVEL_KEY = re.compile(r"loss_([a-z]+)_(.+)")
LOWER_BOUND = re.compile(r"[0-9.]+(?:e[+-]?[0-9]+)?")  # a bucket's lower edge as `f"{edge:g}"` writes it
# (file stem, title, y label, metrics keys): one panel each; a panel whose keys were never logged is left
# out. LEVELS stands for the loss-per-level keys, whatever the objective calls its level.
LEVELS = "loss_<level>_"
PANELS = (
    ("loss", "loss", "loss", ("loss",)),
    ("loss_level", "loss per noise level", "loss", (LEVELS,)),
    ("lr", "learning rate", "lr", ("lr",)),
    ("grad_norm", "gradient norm (before clipping)", "norm", ("grad_norm",)),
    ("step_time", "step time", "seconds", ("step_time_s",)),
    ("mfu", "model FLOP utilisation", "MFU", ("mfu",)),
)


def _series(records: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for r in records:
        v = r.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and "step" in r:
            xs.append(float(r["step"]))
            ys.append(float(v))
    return xs, ys


def _keys(records: list[dict[str, Any]], patterns: tuple[str, ...]) -> list[str]:
    present = {k for r in records for k in r}
    if patterns == (LEVELS,):  # low noise to high, by each bucket's lower bound
        levels = [(m, k) for k in present if (m := LEVEL_KEY.fullmatch(k))]
        return [k for _, k in sorted(levels, key=lambda mk: (mk[0].group(1), *_lower(mk[0].group(2))))]
    return [k for k in sorted(present) if k in patterns]


def _lower(bucket: str) -> tuple[float, str]:
    """Sort key of a bucket name (`0.1-0.5`): its lower edge, then the name (a name without one last)."""
    edge = LOWER_BOUND.match(bucket)
    return (float(edge.group()) if edge else math.inf, bucket)


def draw_curves(records: list[dict[str, Any]], out: Path) -> list[dict[str, str]]:
    """A PNG per panel with data into `out`; returns [{src (relative to out's parent), title}]."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    plots = []
    for stem, title, ylabel, patterns in PANELS:
        lines = [(k, *_series(records, k)) for k in _keys(records, patterns)]
        lines = [line for line in lines if line[1]]
        if not lines or all(v == 0 for _, _, ys in lines for v in ys):  # never logged, or logged as 0
            continue
        fig, ax = plt.subplots(figsize=(5, 3.2))
        level = None
        for key, xs, ys in lines:
            match = LEVEL_KEY.fullmatch(key)
            level = match.group(1) if match else None
            # A key is data: "$" would start matplotlib's mathtext (a raw parse error on an odd "$...$").
            label = (match.group(2) if match else key).replace("$", r"\$")
            ax.plot(xs, ys, marker="." if len(xs) < 50 else None, label=label)
        if level is not None:
            title = f"{title} ({level})"
        if len(lines) > 1:
            ax.legend(fontsize=7, title=level, title_fontsize=7)
        if stem in ("loss", "loss_level", "grad_norm") and min(min(ys) for _, _, ys in lines) > 0:
            # Losses fall over orders of magnitude; a linear axis shows only the first steps.
            spread = max(max(ys) for _, _, ys in lines) / min(min(ys) for _, _, ys in lines)
            if spread > 20:
                ax.set_yscale("log")
        elif stem in ("lr", "step_time", "mfu"):
            ax.set_ylim(bottom=0)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        with atomic_path(out / f"{stem}.png") as tmp:
            fig.savefig(tmp, dpi=80, format="png")
        plt.close(fig)
        plots.append({"src": f"{out.name}/{stem}.png", "title": title})
    return plots


def _validation_prompts(run_dir: Path) -> list[str]:
    for path in (run_dir / "export" / "profile.yaml", run_dir / "profile.yaml"):
        if path.is_file():
            data = yaml.safe_load(path.read_text()) or {}
            return list((data.get("train") or {}).get("validation_prompts") or [])
    return []


def load(run_dir: Path, out: Path) -> Page:
    metrics_path = run_dir / "metrics.jsonl"
    records = read_jsonl(metrics_path) if metrics_path.is_file() else []
    page = Page(kind="train", title=f"vidforge train: {run_dir.name}", summary=[("run", str(run_dir))])
    if records:
        last = records[-1]
        page.summary += [("logged steps", str(len(records))), ("last step", str(last.get("step")))]
        if isinstance(last.get("loss"), (int, float)):
            page.summary.append(("last loss", f"{last['loss']:.4g}"))
        page.plots = draw_curves(records, out / "plots")
    else:
        page.notes.append("no metrics.jsonl: nothing logged yet")
    page.items = validation_items(run_dir, _validation_prompts(run_dir))
    if not page.items:
        page.notes.append(
            "no validation samples in validation/ (train.validate_every sets how often they are drawn); "
            "`vidforge infer` samples the export"
        )
    return page
