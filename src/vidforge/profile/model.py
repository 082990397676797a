"""`model`: the diffusion transformer's shape. A `preset` fills every field it knows; fields given beside
it override the preset (e.g. `{preset: dit-7b, layers: 4}` for a shallow copy)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from vidforge.families import REGISTRY, family, presets
from vidforge.section import Section

PRESETS: dict[str, dict[str, Any]] = presets()
"""Every family's named shapes (`vidforge.families`: each family's module lists its own)."""

RUNTIME_FIELDS = ("attention", "sdpa_backend", "attention_window", "attention_tile", "attention_topk")
"""Model fields that choose how the network runs (its attention kernel and sparsity), not which tensors it
has or what they mean: the profile's, never the weights' config (a model samples with sliding-tile or
sparse attention without training again). Every other field is the weights'."""


def with_runtime(weights: Model, runtime: Model) -> Model:
    """`weights` (a weights folder's model section) with `runtime`'s `RUNTIME_FIELDS`, validated (a window
    list of another length than the layers, a window beside top-k, ... raise ValueError)."""
    data = weights.model_dump()
    data.update({name: getattr(runtime, name) for name in RUNTIME_FIELDS})
    return Model.model_validate({**data, "preset": None})


class Model(Section):
    """The DiT / ST-DiT architecture."""

    preset: str | None = "tiny"
    """Named shape to start from: tiny, small, dit-1b, dit-7b, dit-14b, dit-28b, stdit-7b, stdit-12b,
    wan2.1-1.3b, wan2.1-14b, wan2.2-t2v-a14b, wan2.2-i2v-a14b, wan2.2-ti2v-5b (see `vidforge.models`). null means every field is given explicitly."""
    family: str = "vidforge"
    """Which network (a family registered in `vidforge.families`): `vidforge` (this project's DiT / ST-DiT, `architecture` picks) or `wan` (Wan2.1's
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
    expand_timesteps: bool = False
    """Wan family only: the network conditions on an image through its first latent frame, which enters
    clean with its tokens at noise level 0 while the rest is denoised (Wan2.2 TI2V; diffusers'
    `expand_timesteps`). `infer --image` samples from one; training conditions `diffusion.image_condition`
    of its clips on their own first frame. Needs a temporal patch of 1."""
    condition_channels: int = Field(0, ge=0)
    """Wan family only: latent channels read beside the noisy latents and not predicted (image-to-video:
    Wan2.1-I2V's first-frame mask, 4 per latent frame, and the VAE latent of [first frame, zeros...], 16:
    20). The input layer takes in_channels + condition_channels; the output has in_channels."""
    image_dim: int = Field(0, ge=0)
    """Wan family only: width of the image embedding cross-attention also reads (Wan2.1-I2V: CLIP
    ViT-H's penultimate hidden states, 1280); 0 for none."""
    experts: int = Field(1, ge=1, le=2)
    """Networks of this shape the model is made of, one running at each sampling step: 1, or 2 for a
    mixture of two experts switched by the flow time (Wan2.2 A14B: diffusers' `transformer`, the
    high-noise expert, for t >= boundary_ratio, and `transformer_2`, the low-noise one, below it)."""
    boundary_ratio: float | None = Field(None, gt=0, lt=1)
    """experts=2 only: the flow time t (diffusers' timestep / num_train_timesteps) from which the
    high-noise expert runs (Wan2.2 T2V-A14B: 0.875)."""
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

    attention_window: tuple[int, int, int] | list[tuple[int, int, int] | None] | None = Field(
        None, union_mode="left_to_right"
    )
    """Sliding-tile attention (STA, arXiv 2502.04507; `vidforge.models.sliding_tile`) for the full
    self-attention of video tokens: each query tile attends to the key tiles within this window, in tiles
    per axis (t, h, w), odd (centred on the query's tile, slid inward at the grid's edges). One window for
    every layer, or a list with one entry per layer (null: full attention in that layer). Runs on
    attention=flex (GPU block mask) or sdpa/dense (exact masked reference); text cross-attention is
    untouched. null (the default): full attention everywhere."""
    attention_topk: int | None = Field(None, ge=1)
    """Video sparse attention (VSA, arXiv 2505.13389; `vidforge.models.video_sparse`) for the full
    self-attention of video tokens in every layer: a coarse pass scores each query tile against every key
    tile of its sample (mean-pooled q and k, per head) and the fine pass attends exactly to the keys of
    its `attention_topk` best key tiles. Trainable (the gradients flow through the fine pass); the tiles
    are `attention_tile`. Not with attention_window (one sparse pattern), not on flash, not under context
    parallel. null (the default): off."""
    attention_tile: tuple[int, int, int] = (6, 8, 8)
    """Sliding-tile and video sparse attention's tile, in tokens per axis (t, h, w) (STA's HunyuanVideo
    tile, 384 tokens: three of FlexAttention's 128-token blocks). Must fit the token grid of infer's videos (checked at
    load); along an axis where a training bucket's grid is smaller, that grid is one partial tile."""

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        name = data.get("preset", cls.model_fields["preset"].default)
        if name is None:
            return data
        table = presets()  # read at each validation: a family registered since import counts
        if name not in table:
            raise ValueError(
                f"preset: unknown {name!r}; use one of {sorted(table)} or null with explicit fields"
            )
        return {**table[name], **data}

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
        if self.expand_timesteps and self.patch[0] != 1:
            raise ValueError(
                f"expand_timesteps: the condition frame is the first latent frame, which needs patch[0] = 1, "
                f"got {list(self.patch)}"
            )
        if self.family not in REGISTRY:
            raise ValueError(f"family: unknown {self.family!r}; use one of {', '.join(REGISTRY)}")
        spec = family(self.family)
        for name, value in spec.fixed.items():
            if getattr(self, name) != value:
                raise ValueError(
                    f"{name}: the {self.family} family has {value!r} (its block's), got {getattr(self, name)!r}"
                )
        for other in REGISTRY:
            for name in family(other).own_fields:
                if other != self.family and name not in spec.own_fields and getattr(self, name):
                    raise ValueError(
                        f"{name}: only the {other} family has it; set model.family={other} or drop it"
                    )
        self._check_window()
        if (self.experts == 2) != (self.boundary_ratio is not None):
            raise ValueError(
                "boundary_ratio: a two-expert model (experts=2) needs the flow time its experts switch at "
                f"(Wan2.2 T2V-A14B: 0.875), a one-expert model none; got experts={self.experts}, "
                f"boundary_ratio={self.boundary_ratio}"
            )
        return self

    def _check_window(self) -> None:
        if self.attention_topk is not None:
            self._check_topk()
        if self.attention_window is None:
            return
        if min(self.attention_tile) < 1:
            raise ValueError(
                f"attention_tile: tokens per axis (t, h, w), each >= 1, got {list(self.attention_tile)}"
            )
        windows = self.attention_window
        if isinstance(windows, list) and len(windows) != self.layers:
            raise ValueError(
                f"attention_window: a list needs one entry per layer (model.layers={self.layers}), got "
                f"{len(windows)}; or give one [t, h, w] for every layer"
            )
        for window in windows if isinstance(windows, list) else [windows]:
            if window is not None and any(k < 1 or k % 2 == 0 for k in window):
                raise ValueError(
                    f"attention_window: tiles per axis (t, h, w), each odd (centred on the query's tile), got {list(window)}"
                )
        if self.attention == "flash":
            raise ValueError(
                "attention_window: sliding-tile attention runs on model.attention=flex (GPU) or sdpa/dense, not flash"
            )
        if self.architecture == "stdit" and self.stdit_block != "parallel":
            raise ValueError(
                f"attention_window: model.stdit_block={self.stdit_block} has no full video self-attention to "
                "window (parallel has); drop attention_window or use stdit_block=parallel"
            )

    def _check_topk(self) -> None:
        if self.attention_window is not None:
            raise ValueError(
                "attention_topk: video sparse attention and sliding-tile attention (attention_window) are "
                "two sparse patterns for the same layers; drop one"
            )
        if min(self.attention_tile) < 1:
            raise ValueError(
                f"attention_tile: tokens per axis (t, h, w), each >= 1, got {list(self.attention_tile)}"
            )
        if self.attention == "flash":
            raise ValueError(
                "attention_topk: video sparse attention runs on model.attention=flex (GPU) or sdpa/dense, not flash"
            )
        if self.architecture == "stdit" and self.stdit_block != "parallel":
            raise ValueError(
                f"attention_topk: model.stdit_block={self.stdit_block} has no full video self-attention to "
                "make sparse (parallel has); drop attention_topk or use stdit_block=parallel"
            )

    def layer_window(self, layer: int) -> tuple[int, int, int] | None:
        """Sliding-tile window of block `layer` (tiles per axis), or None for full attention."""
        windows = self.attention_window
        if isinstance(windows, list):
            return None if windows[layer] is None else tuple(windows[layer])
        return None if windows is None else tuple(windows)

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
