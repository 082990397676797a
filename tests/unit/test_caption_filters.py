"""A curation filter is one scorer module plus one registry line (`curate.filters.REGISTRY`): a toy
filter, written here and registered, is set up, run by `vidforge caption` on the sample clips, decides
keep/reject by its own rule, is counted in the summary, and gets its panel on the review page's
histograms, with no other file touched."""

from __future__ import annotations

import json
from typing import Any

import av
import numpy as np
from curation_fixtures import CAPTION_BARE_SETS, make_clips_dir

from vidforge.curate import caption, filters
from vidforge.curate.captioning.captioners import evenly_spaced
from vidforge.curate.filters import Clip, Histogram, Scorer
from vidforge.curate.histograms import histogram_figure
from vidforge.data.manifest import read_jsonl
from vidforge.profile import load_profile
from vidforge.review import curation as review
from vidforge.section import Section

TITLE = "mean brightness of the middle frame"


def brightness_filter(threshold: float) -> type[Scorer]:
    """The toy: a clip's brightness is its middle frame's mean pixel value; darker than `threshold` is
    rejected as `too_dark`."""

    class Brightness(Section):
        enabled: bool = True
        min_brightness: float = threshold

    class BrightnessFilter(Scorer):
        name = "brightness"
        Settings = Brightness
        fields = ("brightness",)
        reasons = ("too_dark",)

        def setup(self, resources) -> None:
            self.ready = True

        def frames(self, count: int) -> set[int]:
            return set(evenly_spaced(count, 1))

        def score_clip(self, clip: Clip) -> dict[str, Any]:
            assert self.ready
            return {"brightness": float(clip.item.sample(1).mean())}

        def reject(self, record: dict[str, Any]) -> list[str]:
            value = record.get("brightness")
            return ["too_dark"] if value is not None and value < self.settings.min_brightness else []

        def histograms(self) -> dict[str, Histogram]:
            return {"brightness": Histogram(TITLE, (self.settings.min_brightness,))}

    return BrightnessFilter


def _middle_frame_mean(path) -> float:
    """Independently of the decode stage: every frame decoded, the middle one's mean."""
    with av.open(str(path)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    return float(frames[(len(frames) - 1) // 2].mean())


def test_a_toy_filter_in_one_module_runs_decides_and_is_drawn(
    tmp_path, sample_videos, sample_truth, monkeypatch
):
    clips = make_clips_dir(tmp_path / "clips", sample_videos, sample_truth)
    inputs = read_jsonl(clips / "manifest.jsonl")
    truth = {}
    for r in inputs:
        try:
            truth[r["clip_id"]] = _middle_frame_mean(clips / r["media"])
        except av.FFmpegError:
            pass  # the corrupt clip
    values = sorted(set(truth.values()))
    assert len(values) >= 2
    threshold = (values[0] + values[1]) / 2  # the darkest clip is rejected, the others kept

    monkeypatch.setattr(filters, "REGISTRY", [*filters.REGISTRY, brightness_filter(threshold)])  # the line
    drawn = {}
    real_draw = review.draw_histograms

    def draw(records, limits, names, path):
        drawn.update(records=records, limits=limits, names=names)
        return real_draw(records, limits, names, path)

    monkeypatch.setattr(review, "draw_histograms", draw)

    out = tmp_path / "out"
    caption.run(load_profile(None, CAPTION_BARE_SETS), clips, out)
    rows = {r["clip_id"]: r for r in read_jsonl(out / "manifest.jsonl")}
    assert set(truth) < set(rows)
    for cid, value in truth.items():
        row = rows[cid]
        assert np.isclose(row["brightness"], value, atol=1e-6)
        assert ("too_dark" in row["reasons"]) == (value < threshold)
        assert row["keep"] == (not row["reasons"])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["by_reason"]["too_dark"] == sum(v < threshold for v in truth.values()) == 1
    assert "brightness" in summary["timings"]

    page = review.load(out, tmp_path / "review")
    assert [p["title"] for p in page.plots] == ["score histograms"]
    assert drawn["names"]["brightness"] == TITLE and drawn["limits"]["brightness"] == [threshold]
    fig = histogram_figure(drawn["records"], drawn["limits"], drawn["names"])
    assert [ax.get_title() for ax in fig.axes] == [f"{TITLE} (n={len(truth)})"]
