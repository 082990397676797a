"""`curation.caption`: settings of `vidforge caption` (captioner backend, quality annotations, keep/reject thresholds)."""

from __future__ import annotations

from vidforge.profile.base import Section


class Caption(Section):
    """Settings of `vidforge caption` (captioner backend, quality annotations, keep/reject thresholds)."""
