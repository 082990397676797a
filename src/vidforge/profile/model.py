"""`model`: the diffusion transformer's shape. A `preset` fills every field it knows; fields given beside
it override the preset (e.g. `{preset: dit-7b, layers: 4}` for a shallow copy)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from vidforge.profile.base import Section

# Shapes of the published models each preset follows. hidden/heads/layers/mlp are the papers' numbers.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {"layers": 2, "hidden": 64, "heads": 4, "mlp_hidden": 256, "text_dim": 32, "in_channels": 4},
    "small": {"layers": 6, "hidden": 256, "heads": 8, "mlp_hidden": 1024, "text_dim": 256},
    # Wan2.1-1.3B.
    "dit-1b": {"layers": 30, "hidden": 1536, "heads": 12, "mlp_hidden": 8960, "in_channels": 16, "text_dim": 4096},
    # NeMo video foundation model paper, DiT-7B / 28B; Wan2.1-14B.
    "dit-7b": {"layers": 28, "hidden": 4096, "heads": 32, "mlp_hidden": 16384, "in_channels": 16, "text_dim": 4096},
    "dit-14b": {"layers": 36, "hidden": 5120, "heads": 40, "mlp_hidden": 13824, "in_channels": 16, "text_dim": 4096},
    "dit-28b": {"layers": 48, "hidden": 6144, "heads": 48, "mlp_hidden": 24576, "in_channels": 16, "text_dim": 4096},
}


class Model(Section):
    """The DiT / ST-DiT architecture."""

    preset: str | None = "tiny"
    """Named shape to start from: tiny, small, dit-1b, dit-7b, dit-14b, dit-28b (see `vidforge.models`)."""
    architecture: Literal["dit", "stdit"] = "dit"
    """`dit`: full 3D self-attention over all tokens. `stdit`: spatial then temporal attention blocks."""
    layers: int = Field(2, ge=1)
    """Transformer blocks."""
    hidden: int = Field(64, ge=1)
    """Model width."""
    heads: int = Field(4, ge=1)
    """Attention heads; hidden must be divisible by it."""
    mlp_hidden: int = Field(256, ge=1)
    """Inner width of the MLP."""
    mlp_act: Literal["gelu-tanh", "swiglu"] = "gelu-tanh"
    """MLP activation: GELU (tanh approximation) or SwiGLU."""
    patch: tuple[int, int, int] = (1, 2, 2)
    """Latent patch size (pt, ph, pw)."""
    in_channels: int = Field(4, ge=1)
    """Latent channels produced by the tokenizer."""
    text_dim: int = Field(32, ge=1)
    """Width of the text encoder's hidden states that cross-attention reads."""
    adaln_lora_rank: int = Field(0, ge=0)
    """Rank of the AdaLN-LoRA modulation projection; 0 uses a full projection per block."""
    qk_norm: bool = True
    """RMSNorm on queries and keys per head."""

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        name = data.get("preset", cls.model_fields["preset"].default)
        if name is None:
            return data
        if name not in PRESETS:
            raise ValueError(f"preset: unknown {name!r}; use one of {sorted(PRESETS)} or null with explicit fields")
        return {**PRESETS[name], **data}

    @model_validator(mode="after")
    def _check(self) -> Model:
        if self.hidden % self.heads:
            raise ValueError(f"hidden: must be divisible by model.heads={self.heads}, got {self.hidden}")
        if (self.hidden // self.heads) % 2:
            raise ValueError(f"hidden: head size {self.hidden // self.heads} must be even for rotary embeddings")
        return self

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads
