"""`model`: the diffusion transformer's shape. A `preset` fills every field it knows; fields given beside
it override the preset (e.g. `{preset: dit-7b, layers: 4}` for a shallow copy)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from vidforge.profile.base import Section

# Shapes of the published models each preset follows. hidden/heads/layers/mlp are the papers' numbers.
# Every preset names its architecture so that `{preset: stdit-7b}` alone builds an ST-DiT. The large
# presets use AdaLN-LoRA (rank 256, as NeMo does): a full modulation projection per block would add
# 9 x hidden^2 per layer (4.2e9 parameters at dit-7b's width). Parameter counts of vidforge's blocks
# (`vidforge.models.count_parameters`): dit-1b 1.5e9, dit-7b 8.0e9, dit-14b 14.9e9, dit-28b 30.3e9,
# stdit-7b 7.3e9, stdit-12b 12.9e9. The wan presets are Wan2.1's published transformers (family wan,
# diffusers' WanTransformer3DModel): wan2.1-1.3b 1.42e9, wan2.1-14b 14.3e9 parameters.

# What Wan2.1 T2V's two sizes share: umT5 text (4096), 16 latent channels, patch 1x2x2 (the default),
# heads of 128, a LayerNorm before cross-attention.
WAN2_1: dict[str, Any] = {
    "family": "wan",
    "architecture": "dit",
    "in_channels": 16,
    "text_dim": 4096,
    "cross_attn_norm": True,
}
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {
        "architecture": "dit",
        "layers": 2,
        "hidden": 64,
        "heads": 4,
        "mlp_hidden": 256,
        "text_dim": 32,
        "in_channels": 4,
    },
    "small": {
        "architecture": "dit",
        "layers": 6,
        "hidden": 256,
        "heads": 8,
        "mlp_hidden": 1024,
        "text_dim": 256,
        "in_channels": 4,
    },
    # Wan2.1-1.3B: 30 x 1536, 12 heads of 128, MLP 8960, umT5 text (4096), 16 latent channels.
    "dit-1b": {
        "architecture": "dit",
        "layers": 30,
        "hidden": 1536,
        "heads": 12,
        "mlp_hidden": 8960,
        "in_channels": 16,
        "text_dim": 4096,
        "adaln_lora_rank": 256,
    },
    # NeMo video foundation model paper, DiT-7B / 28B; dit-14b is the 14B infrastructure article's DiT
    # ("Training 14B Video Models: Infrastructure Deep Dive": 40 layers, 5120 wide, 40 heads, FFN 13,824),
    # which is Wan2.1-14B's shape.
    "dit-7b": {
        "architecture": "dit",
        "layers": 28,
        "hidden": 4096,
        "heads": 32,
        "mlp_hidden": 16384,
        "in_channels": 16,
        "text_dim": 4096,
        "adaln_lora_rank": 256,
    },
    "dit-14b": {
        "architecture": "dit",
        "layers": 40,
        "hidden": 5120,
        "heads": 40,
        "mlp_hidden": 13824,
        "in_channels": 16,
        "text_dim": 4096,
        "adaln_lora_rank": 256,
    },
    "dit-28b": {
        "architecture": "dit",
        "layers": 48,
        "hidden": 6144,
        "heads": 48,
        "mlp_hidden": 24576,
        "in_channels": 16,
        "text_dim": 4096,
        "adaln_lora_rank": 256,
    },
    # The NeMo paper's ST-DiT 7B and 12B sizes. An ST-DiT block holds two self-attentions (spatial,
    # temporal), so at equal width it has ~1.3x the parameters of a DiT block. The paper gives the
    # sizes, not every dimension: these widths and depths are ours, chosen to land on those sizes.
    "stdit-7b": {
        "architecture": "stdit",
        "layers": 36,
        "hidden": 3072,
        "heads": 24,
        "mlp_hidden": 12288,
        "in_channels": 16,
        "text_dim": 4096,
        "adaln_lora_rank": 256,
    },
    "stdit-12b": {
        "architecture": "stdit",
        "layers": 36,
        "hidden": 4096,
        "heads": 32,
        "mlp_hidden": 16384,
        "in_channels": 16,
        "text_dim": 4096,
        "adaln_lora_rank": 256,
    },
    # Wan2.1 T2V, the Wan2.1-T2V-{1.3B,14B}-Diffusers transformer configs.
    "wan2.1-1.3b": {**WAN2_1, "layers": 30, "hidden": 1536, "heads": 12, "mlp_hidden": 8960},
    "wan2.1-14b": {**WAN2_1, "layers": 40, "hidden": 5120, "heads": 40, "mlp_hidden": 13824},
}

# What the wan family fixes: Wan2.1's block has exactly this shape, so a field set otherwise has no
# meaning there (the field names the first one that differs).
WAN_FIXED: dict[str, Any] = {
    "architecture": "dit",
    "mlp_act": "gelu-tanh",
    "adaln_lora_rank": 0,
    "abs_position": "none",
    "qk_norm": True,
    "text_pool": False,
}


class Model(Section):
    """The DiT / ST-DiT architecture."""

    preset: str | None = "tiny"
    """Named shape to start from: tiny, small, dit-1b, dit-7b, dit-14b, dit-28b, stdit-7b, stdit-12b,
    wan2.1-1.3b, wan2.1-14b (see `vidforge.models`). null means every field is given explicitly."""
    family: Literal["vidforge", "wan"] = "vidforge"
    """Which network: `vidforge` (this project's DiT / ST-DiT, `architecture` picks) or `wan` (Wan2.1's
    transformer, diffusers' WanTransformer3DModel module for module, so its published weights load by
    name; `vidforge model import` brings them in). The wan family fixes architecture=dit,
    mlp_act=gelu-tanh, adaln_lora_rank=0, abs_position=none and qk_norm=true (RMSNorm across all heads)."""
    architecture: Literal["dit", "stdit"] = "dit"
    """`dit`: full 3D self-attention over all tokens. `stdit`: spatial then temporal attention blocks."""
    stdit_block: Literal["sequential", "parallel", "parallel-mm"] = "sequential"
    """ST-DiT only. `sequential`: spatial, temporal, cross-attention and MLP one after another (NeMo
    ST-DiT). `parallel`: spatial, temporal and full-sequence attention read the same normalised input
    and their outputs are summed, then cross-attention (video-only branches). `parallel-mm`: Vchitect-2.0's
    multimodal block as the paper describes it: each branch a joint (MM-DiT) attention of video and
    caption tokens with per-modality weights, learnable context latents, one gate per branch, no
    cross-attention (see `vidforge.models.mmblock`); no tensor or context parallel yet."""
    context_latents: int = Field(4, ge=0)
    """stdit_block=parallel-mm only: learnable context tokens per block, appended to every caption as
    keys of each joint attention."""
    layers: int = Field(2, ge=1)
    """Transformer blocks."""
    hidden: int = Field(64, ge=1)
    """Model width."""
    heads: int = Field(4, ge=1)
    """Attention heads; hidden must be divisible by it."""
    mlp_hidden: int = Field(256, ge=1)
    """Inner width of the MLP."""
    mlp_act: Literal["gelu-tanh", "swiglu"] = "gelu-tanh"
    """MLP activation: GELU (tanh approximation) with two matrices, or SwiGLU with three."""
    patch: tuple[int, int, int] = (1, 2, 2)
    """Latent patch size (pt, ph, pw): each token covers pt frames x ph rows x pw columns of the latent."""
    in_channels: int = Field(4, ge=1)
    """Latent channels produced by the tokenizer."""
    text_dim: int = Field(32, ge=1)
    """Width of the text encoder's hidden states that cross-attention reads."""
    adaln_lora_rank: int = Field(0, ge=0)
    """Rank of the AdaLN-LoRA modulation (NeMo; Gupta et al. 2023): one shared full projection of the
    timestep embedding plus, per block, a rank-r update. 0 uses a full projection per block."""
    qk_norm: bool = True
    """RMSNorm on queries and keys per head (keeps attention logits bounded in bf16)."""
    cross_attn_norm: bool = False
    """Wan family only: a LayerNorm (with weight and bias) on the tokens before cross-attention (Wan2.1:
    true)."""
    rope_theta: float = Field(10000.0, gt=0)
    """Base of the rotary position embedding's frequencies."""
    abs_position: Literal["none", "sincos"] = "none"
    """Absolute position embedding added to the tokens after the patch embedding, besides RoPE.
    `sincos`: fixed 3D sine-cosine features of (t, h, w) (DiT's 2D embedding, one axis more). RoPE only
    encodes offsets, so a small model given pure noise cannot tell where in the frame it is and puts
    content anywhere; `sincos` lets it learn layouts. `none`: RoPE only."""
    text_pool: bool = False
    """Also condition every adaLN modulation on the caption: the mean of its tokens, through an MLP, added
    to the timestep embedding (SD3's pooled text beside cross-attention). The demo's two-layer model
    learnt the prompt's colour through cross-attention alone at some training seeds only."""
    attention: Literal["sdpa", "flex", "flash", "dense"] = "sdpa"
    """Attention backend. `sdpa`: torch scaled_dot_product_attention (packed sequences run per sample).
    `flex`: FlexAttention with a document mask (GPU; compiled). `flash`: flash-attn varlen (needs the
    `gpu` extra). `dense`: an explicit block-diagonal mask, slow but runs anywhere (CPU reference)."""
    sdpa_backend: Literal["auto", "cudnn", "flash", "efficient", "math"] = "auto"
    """With attention=sdpa on GPU: force one SDPA kernel, or `auto`: on Hopper (H100/H200) cuDNN first for
    unmasked calls (measured fastest on an H200), elsewhere torch's own choice; a call with a key-padding
    mask runs on a kernel that takes one (memory-efficient first), also when the forced kernel takes none
    (flash: said once). Ignored on CPU."""

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        name = data.get("preset", cls.model_fields["preset"].default)
        if name is None:
            return data
        if name not in PRESETS:
            raise ValueError(
                f"preset: unknown {name!r}; use one of {sorted(PRESETS)} or null with explicit fields"
            )
        return {**PRESETS[name], **data}

    @model_validator(mode="after")
    def _check(self) -> Model:
        if self.hidden % self.heads:
            raise ValueError(f"hidden: must be divisible by model.heads={self.heads}, got {self.hidden}")
        if (self.hidden // self.heads) % 2 or self.hidden // self.heads < 6:
            raise ValueError(
                f"hidden: head size hidden/heads = {self.hidden // self.heads} must be even and at least 6 "
                "for 3D rotary embeddings (t, h and w each get an even share); change hidden or heads"
            )
        if any(p < 1 for p in self.patch):
            raise ValueError(f"patch: every patch size must be >= 1, got {list(self.patch)}")
        if self.family == "wan":
            for name, value in WAN_FIXED.items():
                if getattr(self, name) != value:
                    raise ValueError(
                        f"{name}: the wan family has {value!r} (Wan2.1's block), got {getattr(self, name)!r}"
                    )
        elif self.cross_attn_norm:
            raise ValueError("cross_attn_norm: only the wan family has it; set model.family=wan or drop it")
        return self

    @property
    def multimodal_block(self) -> bool:
        """Blocks read the caption in joint attention (ST-DiT, stdit_block=parallel-mm), not through a
        cross-attention sub-layer."""
        return self.architecture == "stdit" and self.stdit_block == "parallel-mm"

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def patch_dim(self) -> int:
        """Features per token before the patch embedding: in_channels x pt x ph x pw."""
        pt, ph, pw = self.patch
        return self.in_channels * pt * ph * pw
