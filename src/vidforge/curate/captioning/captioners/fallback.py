"""A caption backend that runs only where a clip has no caption of its own (`curation.caption.fallback`):
NeMo's curation writes VLM captions "when no caption for the video has been provided". The primary
captioner (the sources' own captions, `backend: sidecar`) answers first; the clips it marks `missing` go to
the fallback (CoCa or an endpoint) in one batch, so a source that came with captions costs no model call."""

from __future__ import annotations

from vidforge.curate.captioning.captioners import Captioner, CaptionResult, ClipItem


class FallbackCaptioner:
    def __init__(self, primary: Captioner, fallback: Captioner):
        self.primary, self.fallback = primary, fallback
        self.name = f"{primary.name}+{fallback.name}"
        self.frames = max(
            primary.frames, fallback.frames
        )  # decoded for every clip: which need them is not known yet

    def setup(self) -> None:
        self.primary.setup()
        self.fallback.setup()

    def caption(self, items: list[ClipItem]) -> list[CaptionResult]:
        results = self.primary.caption(items)
        missing = [i for i, r in enumerate(results) if r.missing]
        if missing:
            for i, result in zip(missing, self.fallback.caption([items[i] for i in missing]), strict=True):
                results[i] = result
        return results

    def close(self) -> None:
        for part in (self.primary, self.fallback):
            close = getattr(part, "close", None)
            if close is not None:
                close()
