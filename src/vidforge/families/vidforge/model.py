"""The vidforge family's model section: the DiT / ST-DiT's own options beside what every family has."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from vidforge.families.model import Model, NoImageInputs


class VidforgeModel(Model, NoImageInputs):
    """This project's DiT / ST-DiT (`architecture` picks)."""

    family: Literal["vidforge"] = "vidforge"
    """This project's DiT / ST-DiT."""
    architecture: Literal["dit", "stdit"] = "dit"
    """`dit`: full 3D self-attention over all tokens. `stdit`: spatial then temporal attention blocks."""
    stdit_block: Literal["sequential", "parallel", "parallel-mm"] = "sequential"
    """ST-DiT only. `sequential`: spatial, temporal, cross-attention and MLP one after another (NeMo
    ST-DiT). `parallel`: spatial, temporal and full-sequence attention read the same normalised input
    and their outputs are summed, then cross-attention (video-only branches). `parallel-mm`: Vchitect-2.0's
    multimodal block as the paper describes it: each branch a joint (MM-DiT) attention of video and
    caption tokens with per-modality weights, learnable context latents, one gate per branch, no
    cross-attention (see `vidforge.families.vidforge.mmblock`); no tensor or context parallel yet."""
    context_latents: int = Field(4, ge=0)
    """stdit_block=parallel-mm only: learnable context tokens per block, appended to every caption as
    keys of each joint attention."""
    mlp_act: Literal["gelu-tanh", "swiglu"] = "gelu-tanh"
    """MLP activation: GELU (tanh approximation) with two matrices, or SwiGLU with three."""
    adaln_lora_rank: int = Field(0, ge=0)
    """Rank of the AdaLN-LoRA modulation (NeMo; Gupta et al. 2023): one shared full projection of the
    timestep embedding plus, per block, a rank-r update. 0 uses a full projection per block."""
    qk_norm: bool = True
    """RMSNorm on queries and keys per head (keeps attention logits bounded in bf16)."""
    abs_position: Literal["none", "sincos"] = "none"
    """Absolute position embedding added to the tokens after the patch embedding, besides RoPE.
    `sincos`: fixed 3D sine-cosine features of (t, h, w) (DiT's 2D embedding, one axis more). RoPE only
    encodes offsets, so a small model given pure noise cannot tell where in the frame it is and puts
    content anywhere; `sincos` lets it learn layouts. `none`: RoPE only."""
    text_pool: bool = False
    """Also condition every adaLN modulation on the caption: the mean of its tokens, through an MLP, added
    to the timestep embedding (SD3's pooled text beside cross-attention). The demo's two-layer model
    learnt the prompt's colour through cross-attention alone at some training seeds only."""

    cross_attn_norm: ClassVar[bool] = False  # cross-attention reads the block's stream as it is

    @model_validator(mode="after")
    def _check_sparse_layers(self) -> VidforgeModel:
        """Sliding-tile and video sparse attention need a full video self-attention to make sparse."""
        for name, verb in (("attention_window", "window"), ("attention_topk", "make sparse")):
            if (
                getattr(self, name) is not None
                and self.architecture == "stdit"
                and self.stdit_block != "parallel"
            ):
                raise ValueError(
                    f"{name}: model.stdit_block={self.stdit_block} has no full video self-attention to "
                    f"{verb} (parallel has); drop {name} or use stdit_block=parallel"
                )
        return self

    @property
    def multimodal_block(self) -> bool:
        """Blocks read the caption in joint attention (ST-DiT, stdit_block=parallel-mm), not through a
        cross-attention sub-layer."""
        return self.architecture == "stdit" and self.stdit_block == "parallel-mm"
