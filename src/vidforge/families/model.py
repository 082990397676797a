"""The profile's `model` section. `Model` holds what every family's network has (its size, patching, the
attention backend and its sparse patterns, time-switched experts); each family's own section derives from
it in the family's package (`families/<name>/model.py`: `family: Literal["<name>"]` and the fields only it
has) and its spec names it (`FamilySpec.model`). `Model.model_validate(data)` validates `data` as the
section of the family it names (`family`, else its preset's), so `vidforge profile schema` shows each
family's fields and a new family adds a class instead of editing a shared one.

Code that reads a field of any model (`condition_channels`, `architecture`, ...) finds it on every
section: a family without it answers with a class constant (`FixedBlock`, `NoImageInputs`), its value,
which a profile may restate but not change (refused at load, naming the family's value)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from vidforge.section import Section, unknown_field


class Model(Section):
    """The diffusion transformer, as every family has it (each family's section adds its own fields)."""

    preset: str | None = "tiny"
    """Named shape to start from: tiny, small, dit-1b, dit-7b, dit-14b, dit-28b, stdit-7b, stdit-12b,
    and each family's (`vidforge profile show`, `vidforge.families`). null means every field is given explicitly."""
    family: str = "vidforge"
    """Which network: a family registered in `vidforge.families` (`vidforge`: this project's DiT / ST-DiT;
    `wan`: Wan2.1/2.2's transformer, diffusers' WanTransformer3DModel module for module, so its published
    weights load by name). Unset, the preset's family."""
    layers: int = Field(2, ge=1)
    """Transformer blocks."""
    hidden: int = Field(64, ge=1)
    """Model width."""
    heads: int = Field(4, ge=1)
    """Attention heads; hidden must be divisible by it."""
    mlp_hidden: int = Field(256, ge=1)
    """Inner width of the MLP."""
    patch: tuple[int, int, int] = (1, 2, 2)
    """Latent patch size (pt, ph, pw): each token covers pt frames x ph rows x pw columns of the latent."""
    in_channels: int = Field(4, ge=1)
    """Latent channels produced by the tokenizer."""
    text_dim: int = Field(32, ge=1)
    """Width of the text encoder's hidden states that cross-attention reads."""
    experts: int = Field(1, ge=1, le=2)
    """Networks of this shape the model is made of, one running at each sampling step: 1, or 2 for a
    mixture of two experts switched by the flow time (Wan2.2 A14B: diffusers' `transformer`, the
    high-noise expert, for t >= boundary_ratio, and `transformer_2`, the low-noise one, below it)."""
    boundary_ratio: float | None = Field(None, gt=0, lt=1)
    """experts=2 only: the flow time t (diffusers' timestep / num_train_timesteps) from which the
    high-noise expert runs (Wan2.2 T2V-A14B: 0.875)."""
    rope_theta: float = Field(10000.0, gt=0)
    """Base of the rotary position embedding's frequencies."""
    attention: Literal["sdpa", "flex", "flash", "dense"] = "sdpa"
    """Attention backend. `sdpa`: torch scaled_dot_product_attention (packed sequences run per sample).
    `flex`: FlexAttention with a document mask (GPU; compiled). `flash`: flash-attn varlen (needs the
    `gpu` extra). `dense`: an explicit block-diagonal mask, slow but runs anywhere (CPU reference)."""
    sdpa_backend: Literal["auto", "cudnn", "flash", "efficient", "math"] = "auto"
    """With attention=sdpa on GPU: force one SDPA kernel, or `auto`: on Hopper (H100/H200) cuDNN first for
    unmasked calls (measured fastest on an H200), elsewhere torch's own choice; a call with a key-padding
    mask runs on a kernel that takes one (memory-efficient first), also when the forced kernel takes none
    (flash: said once). Ignored on CPU."""
    attention_window: tuple[int, int, int] | tuple[tuple[int, int, int] | None, ...] | None = Field(
        None, union_mode="left_to_right"
    )
    """Sliding-tile attention (STA, arXiv 2502.04507; `vidforge.attention.sliding_tile`) for the full
    self-attention of video tokens: each query tile attends to the key tiles within this window, in tiles
    per axis (t, h, w), odd (centred on the query's tile, slid inward at the grid's edges). One window for
    every layer, or a list with one entry per layer (null: full attention in that layer). Runs on
    attention=flex (GPU block mask) or sdpa/dense (exact masked reference); text cross-attention is
    untouched. null (the default): full attention everywhere."""
    attention_topk: int | None = Field(None, ge=1)
    """Video sparse attention (VSA, arXiv 2505.13389; `vidforge.attention.video_sparse`) for the full
    self-attention of video tokens in every layer: a coarse pass scores each query tile against every key
    tile of its sample (mean-pooled q and k, per head) and the fine pass attends exactly to the keys of
    its `attention_topk` best key tiles. Trainable (the gradients flow through the fine pass); the tiles
    are `attention_tile`. Not with attention_window (one sparse pattern), not on flash, not under context
    parallel. null (the default): off."""
    attention_tile: tuple[int, int, int] = (6, 8, 8)
    """Sliding-tile and video sparse attention's tile, in tokens per axis (t, h, w) (STA's HunyuanVideo
    tile, 384 tokens: three of FlexAttention's 128-token blocks). Must fit the token grid of infer's videos (checked at
    load); along an axis where a training bucket's grid is smaller, that grid is one partial tile."""

    def __init__(self, **data: Any) -> None:
        if type(self) is Model:
            raise TypeError("Model is every family's base: use Model.model_validate(fields)")
        super().__init__(**data)

    @classmethod
    def model_validate(cls, obj: Any, **kwargs: Any) -> Model:
        """`obj` as the section of its family (on `Model`), or of this family (on a family's section)."""
        if cls is Model and not isinstance(obj, Model):
            return section_class(obj).model_validate(obj, **kwargs)
        return super().model_validate(obj, **kwargs)

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        from vidforge.families import presets

        name = data.get("preset", cls.model_fields["preset"].default)
        if name is not None:
            table = presets()  # read at each validation: a family registered since import counts
            if name not in table:
                raise ValueError(
                    f"preset: unknown {name!r}; use one of {sorted(table)} or null with explicit fields"
                )
            data = {**table[name], **data}
        return cls._own_fields(data)

    @classmethod
    def _own_fields(cls, data: dict[str, Any]) -> dict[str, Any]:
        """`data` without the fields this family holds constant where they restate its value; another
        family's field (another value of one of those constants included) refused naming its family."""
        from vidforge.families import REGISTRY, family

        own = cls.model_fields["family"].default
        kept = {}
        for key, value in data.items():
            if key in cls.model_fields:
                kept[key] = value
                continue
            owners = [n for n in REGISTRY if key in family(n).model.model_fields]
            if owners and hasattr(cls, key) and _restates(value, getattr(cls, key)):
                continue  # restates this family's value
            if owners:
                here = (
                    f" (the {own} family has {getattr(cls, key)!r}, got {value!r})"
                    if hasattr(cls, key)
                    else ""
                )
                raise ValueError(
                    f"{key}: only the {' and '.join(owners)} famil{'ies have' if len(owners) > 1 else 'y has'} it{here}; set model.family={owners[0]} "
                    "or drop it"
                )
            raise ValueError(f"{key}: {unknown_field(key, list(cls.model_fields))}")
        return kept

    @classmethod
    def fixed_fields(cls) -> dict[str, Any]:
        """The fields other families set that this family holds constant, with its values: what a profile
        switching to this family restates so that the fields of the family it had do not linger."""
        from vidforge.families import REGISTRY, family

        others = {k for n in REGISTRY for k in family(n).model.model_fields} - set(cls.model_fields)
        return {k: getattr(cls, k) for k in sorted(others) if hasattr(cls, k)}

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
        if self._per_layer_windows and len(windows) != self.layers:
            raise ValueError(
                f"attention_window: a list needs one entry per layer (model.layers={self.layers}), got "
                f"{len(windows)}; or give one [t, h, w] for every layer"
            )
        for window in windows if self._per_layer_windows else [windows]:
            if window is not None and any(k < 1 or k % 2 == 0 for k in window):
                raise ValueError(
                    f"attention_window: tiles per axis (t, h, w), each odd (centred on the query's tile), got {list(window)}"
                )
        if self.attention == "flash":
            raise ValueError(
                "attention_window: sliding-tile attention runs on model.attention=flex (GPU) or sdpa/dense, not flash"
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

    def layer_window(self, layer: int) -> tuple[int, int, int] | None:
        """Sliding-tile window of block `layer` (tiles per axis), or None for full attention."""
        windows = self.attention_window
        if self._per_layer_windows:
            return None if windows[layer] is None else tuple(windows[layer])
        return None if windows is None else tuple(windows)

    @property
    def _per_layer_windows(self) -> bool:
        """`attention_window` holds one entry per layer rather than one (t, h, w) for all. Both are tuples
        (the section is hashed: estimates cache on it), so the entries tell them apart."""
        windows = self.attention_window
        return windows is not None and not all(isinstance(k, int) for k in windows)

    @property
    def multimodal_block(self) -> bool:
        """Blocks read the caption in joint attention, not through a cross-attention sub-layer."""
        return False

    @property
    def samples_from_image(self) -> bool:
        """Sampling needs a first frame (`infer --image`): the condition channels are an image's. A family
        whose text-to-video weights read zeros there (HunyuanVideo-1.5 T2V) says False."""
        return bool(self.condition_channels)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def patch_dim(self) -> int:
        """Features per token before the patch embedding: in_channels x pt x ph x pw."""
        pt, ph, pw = self.patch
        return self.in_channels * pt * ph * pw


class FixedBlock:
    """The vidforge family's block options, as a family with one block design of its own answers them:
    a DiT block (full attention) with a GELU-tanh MLP, a full modulation projection, QK RMSNorm, RoPE only,
    no pooled text."""

    architecture: ClassVar[str] = "dit"
    stdit_block: ClassVar[str] = "sequential"
    context_latents: ClassVar[int] = 0
    mlp_act: ClassVar[str] = "gelu-tanh"
    adaln_lora_rank: ClassVar[int] = 0
    qk_norm: ClassVar[bool] = True
    abs_position: ClassVar[str] = "none"
    text_pool: ClassVar[bool] = False


class NoImageInputs:
    """The image inputs of a family that reads none: no condition channels, no image embedding, no
    first-frame conditioning."""

    expand_timesteps: ClassVar[bool] = False
    condition_channels: ClassVar[int] = 0
    image_dim: ClassVar[int] = 0


def _restates(value: Any, fixed: Any) -> bool:
    """Whether `value` is `fixed` as a profile may spell it: a list for a tuple, `'true'` or `'0'` where a
    setting arrives as text."""
    if isinstance(value, (list, tuple)) and isinstance(fixed, (list, tuple)):
        return len(value) == len(fixed) and all(_restates(v, f) for v, f in zip(value, fixed, strict=True))
    return value == fixed or str(value).strip().lower() == str(fixed).lower()


def section_class(data: Any) -> type[Model]:
    """The section class of the family `data` names (`family`, else its preset's, else the default's)."""
    from vidforge.families import REGISTRY, family, presets

    data = data if isinstance(data, dict) else {}
    name = data.get("family")
    if name is None:
        table = presets()
        preset = data.get("preset", Model.model_fields["preset"].default)
        known = isinstance(preset, str) and preset in table
        name = table[preset]["family"] if known else Model.model_fields["family"].default
    if not isinstance(name, str) or name not in REGISTRY:
        raise ValueError(f"family: unknown {name!r}; use one of {', '.join(REGISTRY)}")
    return family(name).model
