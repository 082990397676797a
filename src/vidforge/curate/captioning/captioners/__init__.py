"""Captioners: each turns clips (their records and decoded frames) into one caption per clip.

A captioner has a one-time `setup()` that fails fast when its model or endpoint is unusable, says how
many evenly spaced frames it wants per clip (`frames`), and a `caption(items)` that returns one
`CaptionResult` per item, in order. A clip whose model call fails gets a result with `error` set; the
other clips of the batch are unaffected."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np


def evenly_spaced(num_frames: int, k: int) -> list[int]:
    """`k` frame indices spread over `[0, num_frames)` with both ends included (1 -> the middle frame,
    3 -> first/middle/last). Fewer when the clip is shorter than `k`."""
    if num_frames <= 0:
        return []
    if k == 1:
        return [(num_frames - 1) // 2]
    if k >= num_frames:
        return list(range(num_frames))
    return sorted({round(i * (num_frames - 1) / (k - 1)) for i in range(k)})


@dataclass
class ClipItem:
    """One clip to annotate: its manifest record and the frames decoded for it (index -> (H, W, 3) uint8)."""

    clip_id: str
    record: dict[str, Any]
    num_frames: int
    frames: dict[int, np.ndarray] = field(default_factory=dict)

    def sample(self, k: int) -> np.ndarray:
        """`k` evenly spaced frames as an (N, H, W, 3) uint8 array (they must have been decoded)."""
        return np.stack([self.frames[i] for i in evenly_spaced(self.num_frames, k)])


@dataclass
class CaptionResult:
    text: str | None
    """The raw caption (None when the call failed)."""
    source: str
    """Which backend and model wrote it, e.g. `coca:coca_ViT-L-14`."""
    error: str | None = None
    """Why no caption was produced (the rest of the batch goes on)."""
    missing: bool = False
    """The clip has no caption of its own (no sidecar for its source, or no segment overlapping it
    enough): what `curation.caption.fallback` captions."""


class Captioner(Protocol):
    name: str
    frames: int
    """Evenly spaced frames wanted per clip (0: no frames needed)."""

    def setup(self) -> None: ...

    def caption(self, items: list[ClipItem]) -> list[CaptionResult]: ...


def build_captioner(settings: Any, device: str = "cpu", random_weights: bool = False) -> Captioner:
    """The captioner the profile's `curation.caption` section names (`settings` is that section), with
    its `fallback` behind it when one is set."""
    captioner = _backend(settings.backend, settings, device, random_weights)
    if settings.fallback is None:
        return captioner
    from vidforge.curate.captioning.captioners.fallback import FallbackCaptioner

    return FallbackCaptioner(captioner, _backend(settings.fallback, settings, device, random_weights))


def _backend(backend: str, settings: Any, device: str, random_weights: bool) -> Captioner:
    if backend == "coca":
        from vidforge.curate.captioning.captioners.coca import CocaCaptioner

        return CocaCaptioner(settings.coca, device=device, random_weights=random_weights)
    if backend == "endpoint":
        from vidforge.curate.captioning.captioners.endpoint import EndpointCaptioner

        return EndpointCaptioner(settings.endpoint)
    if backend == "sidecar":
        from vidforge.curate.captioning.captioners.sidecar import SidecarCaptioner

        return SidecarCaptioner(settings.sidecar)
    raise ValueError(f"unknown caption backend {backend!r}")
