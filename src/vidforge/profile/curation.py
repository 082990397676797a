"""`curation`: settings of `vidforge clip` (shot detection, stitching, duration, static filter, transcode, embedding)."""

from __future__ import annotations

from vidforge.profile.base import Section
from vidforge.profile.caption import Caption


class Curation(Section):
    """Settings of `vidforge clip` (shot detection, stitching, duration, static filter, transcode, embedding)."""

    caption: Caption = Caption()
    """Captioning and quality filtering (`vidforge caption`)."""
