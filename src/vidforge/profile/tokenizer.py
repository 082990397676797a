"""`tokenizer`: the video tokenizer of `vidforge tokenize` and `infer` (diffusers causal 3D VAE or the pixel tokenizer)."""

from __future__ import annotations

from vidforge.profile.base import Section


class Tokenizer(Section):
    """The video tokenizer of `vidforge tokenize` and `infer` (diffusers causal 3D VAE or the pixel tokenizer)."""
