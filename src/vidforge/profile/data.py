"""`data`: settings of `vidforge shard` and the training loader (shard size, split, buckets, packing, blending)."""

from __future__ import annotations

from vidforge.profile.base import Section


class Data(Section):
    """Settings of `vidforge shard` and the training loader (shard size, split, buckets, packing, blending)."""
