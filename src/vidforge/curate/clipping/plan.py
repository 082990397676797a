"""Stages 3-5 for one source: stitch shots, apply the duration policy and the static filter, and name
every resulting clip. Runs beside the model (stitching embeds frames); one item per source in and out
(rejected clips included, so the ledger records why they went)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vidforge.curate.clipping.duration import apply_duration
from vidforge.curate.clipping.static import static_ratio, static_reason
from vidforge.curate.clipping.stitch import stitch_shots
from vidforge.curate.items import Analysis, ClipPlan, RecordedShot, Shot
from vidforge.curate.stage import Stage
from vidforge.data.manifest import stable_id
from vidforge.profile.curation import Curation

if TYPE_CHECKING:
    from vidforge.curate.embeddings.embedder import ImageEmbedder


def clip_id(source: str, start: int, end: int) -> str:
    """Deterministic: the same source and span always get the same id."""
    return stable_id(source, start, end)


def plan_clips(analysis: Analysis, cfg: Curation, pooled=None) -> list[ClipPlan]:
    shots = analysis.shots
    if cfg.stitch and pooled is not None and len(shots) > 1:
        shots, _ = stitch_shots(shots, analysis.boundary, cfg.stitch_frames, cfg.stitch_threshold, pooled)
    fps = float(analysis.info.fps)
    plans = []
    for shot in shots:
        spans, reason = apply_duration(
            shot.start, shot.end, fps, cfg.min_seconds, cfg.max_seconds, cfg.trim_seconds
        )
        if not spans:
            plans.append(_plan(analysis, shot, shot.start, shot.end, ("duration", reason)))
            continue
        for start, end in spans:
            ratio = static_ratio(analysis.static, start, end)
            why = static_reason(ratio, cfg.static_max_ratio)
            plans.append(_plan(analysis, shot, start, end, ("static", why) if why else None, ratio))
    for index, plan in enumerate(plans, 1):  # the clip's place in its source, in time order, as named
        plan.index = index
    return plans


def _plan(a: Analysis, shot: Shot, start: int, end: int, rejected, ratio: float | None = None) -> ClipPlan:
    pts = a.pts[start:end] if end > start else a.pts[start : start + 1]
    # Times on the source's own timeline (a frame's presentation time), not from its first frame: a source
    # whose first frame shows at 1.075 s has its first clip start there, as a player and a sidecar see it.
    t0 = float(a.pts[start] * a.time_base) if start < len(a.pts) else _end_s(a)
    t1 = float(a.pts[end] * a.time_base) if end < len(a.pts) else _end_s(a)
    if ratio is None:
        ratio = static_ratio(a.static, start, end)
    return ClipPlan(
        source=a.source,
        clip_id=clip_id(a.source, start, end),
        start=start,
        end=end,
        info=a.info,
        pts=pts,
        time_base=a.time_base,
        start_s=t0,
        end_s=t1,
        score=shot.score,
        static_ratio=ratio,
        stitched=shot.merged,
        rejected=rejected,
    )


def _end_s(a: Analysis) -> float:
    return float(a.pts[0] * a.time_base) + a.info.duration_s


@dataclass
class SourcePlans:
    """All clips planned for one source, and the shots recorded while it was analysed (the transcode stage
    adopts those that are a clip and cuts the others in one decode pass)."""

    source: str
    plans: list[ClipPlan]
    recorded: list[RecordedShot] = field(default_factory=list)

    @property
    def label(self) -> str:
        return self.source


class PlanStage(Stage[Analysis, SourcePlans]):
    """Analysis -> SourcePlans (every clip of the source, kept or rejected). A thread of the driver,
    sharing the embedding model."""

    name = "plan"
    kind = "thread"
    resources = {"num_cpus": 1}  # noqa: RUF012

    def __init__(self, cfg: Curation):
        self.cfg = cfg
        self.embedder: ImageEmbedder | None = None

    def setup(self) -> None:
        if self.cfg.stitch:
            from vidforge.curate.embeddings.embedder import ImageEmbedder

            self.embedder = ImageEmbedder.from_profile(self.cfg)

    def process(self, analysis: Analysis) -> SourcePlans:
        pooled = self.embedder.pooled if self.embedder is not None else None
        return SourcePlans(analysis.source, plan_clips(analysis, self.cfg, pooled), analysis.recorded)

    def __getstate__(self):  # the model is rebuilt by setup() wherever the stage runs
        return {**self.__dict__, "embedder": None}
