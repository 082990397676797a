"""`text_encoder`: the text encoder whose per-token hidden states the DiT cross-attends to."""

from __future__ import annotations

from vidforge.profile.base import Section


class TextEncoder(Section):
    """The text encoder whose per-token hidden states the DiT cross-attends to."""
