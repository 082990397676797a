"""The plots the review page shows: caption score histograms (a panel only for what was measured, the x
axis spanning the data, thresholds labelled where they are or named where they are off the axis), the
bench sweep plot's y axis from zero, and the training curves (a panel only for what was logged)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest

from vidforge.bench.plots import sweep_figure
from vidforge.curate.histograms import histogram_figure, titles
from vidforge.profile.caption import Caption
from vidforge.review.training import LEVELS, _keys, draw_curves


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _texts(ax) -> list[str]:
    return [t.get_text() for t in ax.texts]


def test_histograms_leave_out_scores_nothing_measured() -> None:
    rng = np.random.default_rng(0)
    records = [{"motion": float(v), "aesthetic": None, "keep": True} for v in rng.uniform(0.2, 3.0, 40)]
    fig = histogram_figure(records, {"motion": [0.05, 12.0], "aesthetic": [4.5]}, titles(Caption()))
    [ax] = fig.axes  # aesthetic, text area and CLIP score were not measured: no panels for them
    assert ax.get_title().startswith("motion (px/frame at 128 px) (n=40)")
    assert histogram_figure([{"motion": None}], {}, titles(Caption())) is None


def test_histogram_axes_fit_the_data_and_thresholds_are_labelled() -> None:
    values = [0.30, 0.31, 0.35, 0.40, 0.42, 0.50]
    fig = histogram_figure(
        [{"clip_score": v} for v in values] + [{"aesthetic": v} for v in (4.0, 5.0, 6.0)],
        {"clip_score": [-1.0, 0.33], "aesthetic": [4.5, 100.0]},
        titles(Caption()),
    )
    clip_ax, aesthetic_ax = sorted(fig.axes, key=lambda a: a.get_title())[::-1]
    lo, hi = clip_ax.get_xlim()
    spread = max(values) - min(values)
    # The axis spans the data with a 5% margin, not the threshold at -1 far to its left ...
    assert np.isclose(lo, min(values) - 0.05 * spread) and np.isclose(hi, max(values) + 0.05 * spread)
    # ... which is named at the left edge; the one inside the data is drawn and labelled at its place.
    assert "← threshold -1" in _texts(clip_ax)
    [inside] = [a for a in clip_ax.texts if a.get_text() == "threshold 0.33"]
    assert inside.xy[0] == 0.33
    assert "threshold 4.5" in _texts(aesthetic_ax) and "threshold 100 →" in _texts(aesthetic_ax)
    assert all(float(t).is_integer() for t in clip_ax.get_yticks())  # whole clips


def test_sweep_plot_starts_its_y_axis_at_zero() -> None:
    rows = [
        {"ok": True, "layout": "tp1", "tokens_per_sample": n, "tokens_per_s": 1000.0 + n / 100}
        for n in (1024, 2048, 4096)
    ]
    fig = sweep_figure(rows, ["layout"])
    assert fig.axes[0].get_ylim()[0] == 0
    assert sweep_figure([{"ok": False}], ["layout"]) is None


def test_training_curves_leave_out_metrics_never_logged(tmp_path) -> None:
    records = [
        {"step": s, "loss": 1.0 / s, "lr": 1e-3, "grad_norm": 0.5, "step_time_s": 0.1, "mfu": 0.0}
        for s in range(1, 6)
    ]
    plots = draw_curves(records, tmp_path / "plots")
    # No loss per noise level in these records, and MFU logged as 0 (no peak FLOP/s known): no panels.
    assert [p["title"] for p in plots] == [
        "loss",
        "learning rate",
        "gradient norm (before clipping)",
        "step time",
    ]
    assert all((tmp_path / p["src"]).read_bytes()[:4] == b"\x89PNG" for p in plots)


@pytest.mark.parametrize("objective", ["edm", "flow"])
def test_training_curves_show_every_promised_panel_for_each_objective(objective, tmp_path) -> None:
    """README's train review: loss, loss per noise level, learning rate, gradient norm, step time, MFU;
    the per-level keys are the ones the objective's LossByLevel logs (sigma for EDM, t for flow)."""
    from vidforge.diffusion.from_profile import build_objective
    from vidforge.profile import load_profile
    from vidforge.train.metrics import LossByLevel

    profile = load_profile("local_cpu", [f"diffusion.objective={objective}"])
    levels = LossByLevel(build_objective(profile.diffusion))
    records = [
        {"step": s, "loss": 1.0 / s, "lr": 1e-3, "grad_norm": 0.5, "step_time_s": 0.1, "mfu": 0.2}
        | {name: (i + 1) / s for i, name in enumerate(levels.names)}
        for s in range(1, 6)
    ]
    plt.close("all")
    plots = draw_curves(records, tmp_path / "plots")
    level = {"edm": "sigma", "flow": "t"}[objective]
    assert [p["title"] for p in plots] == [
        "loss",
        f"loss per noise level ({level})",
        "learning rate",
        "gradient norm (before clipping)",
        "step time",
        "model FLOP utilisation",
    ]
    assert _keys(records, (LEVELS,)) == levels.names  # the legend low noise to high, as the objective buckets
