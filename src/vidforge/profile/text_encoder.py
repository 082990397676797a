"""`text_encoder`: the text encoder whose per-token hidden states the DiT cross-attends to."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from vidforge.section import Section


class TextEncoder(Section):
    """The text encoder whose per-token hidden states the DiT cross-attends to."""

    kind: Literal["open-clip", "t5", "family"] = "open-clip"
    """`open-clip`: the text tower of an open-clip model (77 tokens). `t5`: a T5 or umT5 encoder through
    `transformers` (long captions, 100-200+ tokens; what real runs use; the folder's config picks T5 or
    umT5). Wan2.1: `t5` with its pipeline's text_encoder/ (umT5-XXL, 4096 wide) and max_length 512.
    `family`: the model family's own encoder, as its published pipeline encodes a caption (a family that
    has one names it), read from the published folder at `path` (HunyuanVideo-1.5: Qwen2.5-VL and
    Glyph-ByT5, max_length the two encoders' tokens, 1000 + 256)."""
    path: str | None = None
    """Local weights: an open-clip checkpoint file, a transformers T5 folder (config, weights,
    tokenizer), or for `family` the published pipeline folder. null with `open-clip` builds a small random-weight text tower (demo and tests only: its
    embeddings carry no meaning)."""
    tokenizer_path: str | None = None
    """t5 only: the tokenizer's folder when it is not `path` itself (a diffusers pipeline's tokenizer/
    beside its text_encoder/). null: the tokenizer files are in `path`."""
    arch: str = "ViT-B-32"
    """open-clip model name of the checkpoint at `path` (e.g. ViT-L-14)."""
    max_length: int = Field(77, ge=2)
    """Tokens per caption, padded or truncated; the stored embedding is (max_length, width). open-clip
    towers cap this at their context length (77)."""
    random_width: int | None = None
    """Width of the random open-clip tower; null means model.text_dim (what the DiT cross-attends to)."""
    random_layers: int = Field(2, ge=1)
    """Layers of the random open-clip tower."""
    batch_size: int = Field(32, ge=1)
    """Captions encoded per forward pass."""
    device: str = "auto"
    """`auto` (cuda when available), `cpu`, `cuda`, ..."""
    seed: int = 0
    """Seed of the random tower's weights (so reruns give identical embeddings)."""
