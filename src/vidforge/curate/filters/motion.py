"""The motion filter: mean dense optical flow over evenly spaced pairs of consecutive frames
(`curate.scorers.motion`: Farneback, or RAFT from local weights); clips below
`curation.caption.motion.min_score` are too static, above `max_score` too shaky."""

from __future__ import annotations

import math
from typing import Any

from vidforge.curate.filters.base import Clip, Histogram, Resources, Scorer, below, check_weights_file, finite
from vidforge.profile.caption import Caption, Motion


class MotionFilter(Scorer):
    name = "motion"
    Settings = Motion
    fields = ("motion",)
    reasons = ("too_static", "too_shaky")

    def check(self, cfg: Caption) -> None:
        if self.settings.method != "farneback":
            check_weights_file(self.settings.raft_weights, False, "curation.caption.motion.raft_weights")

    def frames(self, count: int) -> set[int]:
        from vidforge.curate.scorers.motion import pair_starts

        return {t + d for t in pair_starts(count, self.settings.pairs) for d in (0, 1)}

    def setup(self, resources: Resources) -> None:
        self.flow = None
        if self.settings.method != "farneback":
            from vidforge.curate.scorers.motion import RaftFlow

            self.flow = RaftFlow(self.settings.method, self.settings.raft_weights, device=resources.device)
            self.flow.setup()

    def score_clip(self, clip: Clip) -> dict[str, Any]:
        from vidforge.curate.scorers.motion import motion_score, pair_starts

        item = clip.item
        pairs = [
            (item.frames[t], item.frames[t + 1]) for t in pair_starts(item.num_frames, self.settings.pairs)
        ]
        return {"motion": finite(motion_score(pairs, self.settings.size, self.flow))}

    def reject(self, record: dict[str, Any]) -> list[str]:
        motion = record.get("motion")
        reasons = ["too_static"] if below(motion, self.settings.min_score) else []
        if motion is not None and not math.isnan(motion) and motion > self.settings.max_score:
            reasons.append("too_shaky")
        return reasons

    def histograms(self) -> dict[str, Histogram]:
        title = f"motion (px/frame at {self.settings.size} px)"
        return {"motion": Histogram(title, (self.settings.min_score, self.settings.max_score))}
