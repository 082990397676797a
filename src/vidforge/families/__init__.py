"""Model families: one package each (`vidforge.families.wan`, `vidforge.families.vidforge`) holding a
`FamilySpec`, and `REGISTRY`, the one place that lists them. Everything that asks "which family" asks
`family(name)`: building the network, its presets and the fields it fixes, how a published folder of its
weights maps to a profile, weight import and export, the tensor-parallel plan, LoRA targets. (FLOPs and
a block's saved bytes are read off the network itself: `models.flops`, `estimate.module_costs`.)

torchtitan's `TrainSpec` and finetrainers' `ModelSpecification` are the examples; unlike theirs a spec
names its code by import path ("package.module:attribute") instead of holding it, so this package imports
no torch and sits below the profile: the profile's validator reads presets and each family's model section from here, and
the network, its weights and its parallel plan load only when asked for (`load`).

Adding a family: a package here whose `__init__` holds `SPEC = FamilySpec(...)`, its model section
(`families/model.py`'s `Model` subclassed) and code beside it, and one line in `REGISTRY`."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vidforge.errors import UserInputError

if TYPE_CHECKING:
    from vidforge.families.model import Model

REGISTRY: dict[str, str] = {
    "vidforge": "vidforge.families.vidforge",
    "wan": "vidforge.families.wan",
    "hunyuan15": "vidforge.families.hunyuan15",
    "ltx2": "vidforge.families.ltx2",
}
"""Family name (the profile's `model.family`) -> the module whose `SPEC` describes it."""


@dataclass(frozen=True)
class Published:
    """A published folder of a family's weights (e.g. a diffusers download), as a profile reads it."""

    family: str
    root: Path
    """The folder the user named."""
    weights: Path
    """The folder holding the network's config and weights (root, or root/transformer)."""
    model: dict[str, Any]
    """The profile's `model` fields for the network as published (preset null)."""
    defaults: Mapping[str, Any]
    """Settings (dotted field -> value) that train and sample it as published: the objective and its
    shift, the tokenizer and text encoder of the folder (when it has them), the caption length, the
    guidance default. A user's --set wins over every one."""
    objective: str
    """The objective the weights were trained with (a profile that says another is refused)."""
    single: str = "diffusion_pytorch_model.safetensors"
    """The weights file in `weights` (diffusers' name) ..."""
    index: str = "diffusion_pytorch_model.safetensors.index.json"
    """... or the index of its shards."""
    expert_folders: Mapping[str, Path] = field(default_factory=dict)
    """A two-expert model's folder of each expert's weights (`weights.experts.EXPERTS` names them); empty
    for one network (in `weights`)."""
    unread: Callable[[str], bool] = lambda name: False
    """Whether a tensor of the published weights is one the family's network does not read (LTX-2's
    audio stream, beside its video path): `train --init` of the folder leaves those out of its match."""

    def expert_weights(self, expert: str | None) -> Path:
        """The folder of `expert`'s weights: `weights` for a one-network folder, or for None."""
        return self.expert_folders[expert] if expert is not None and self.expert_folders else self.weights


@dataclass(frozen=True)
class FamilySpec:
    """What vidforge knows of one model family. Attributes holding "module:attribute" strings are code,
    loaded by `load`."""

    name: str
    model: type[Model]
    """The profile's `model` section of this family (`vidforge.families.model.Model`'s subclass with
    `family: Literal[name]`): its fields, the values it holds constant, its checks."""
    network: str
    """The nn.Module class built from the profile's `model` section (it takes the DiT's forward arguments)."""
    presets: Mapping[str, Mapping[str, Any]]
    """Named shapes (`model.preset`), each a dict of model fields."""
    tensor_parallel: str
    """fn(model, tp_mesh, sequence_parallel=bool): the family's tensor-parallel plan, applied in place."""
    tp_rules: tuple[tuple[str, ...], ...]
    """What that plan splits, for the parameter counts and the activations (`TensorParallelRules`' fields:
    names replicated in a block, the row-wise layers (whose biases stay whole), the column-split modules
    outside the blocks, and optionally the column-split block layers whose output is gathered again)."""
    lora_targets: tuple[str, ...]
    """LoRA's default target modules (train.lora.target_modules left empty)."""
    block_scopes: Callable[[Any], tuple[tuple[str, ...], int]]
    """model section -> (the attention scopes a block runs, the modulation chunks it projects) for FLOPs."""
    sequence_parallel: bool = True
    """Whether the tensor-parallel plan has sequence parallel: a run leaves it on unless something blocks it, and a profile
    asking for it where the plan has none is refused (`profile.layout_rules.sequence_parallel`)."""
    read_published: Callable[[Path], Published | None] | None = None
    """folder -> its `Published` description, or None when it is not this family's published layout."""
    published_class: str | None = None
    """The `_class_name` of the published network's config.json (named when a folder matches no family)."""
    import_weights: str | None = None
    """fn(published: Published, out, profile, dtype) -> Path: write a vidforge export of a published folder."""
    export_weights: str | None = None
    """fn(export, out, max_shard_bytes) -> Path: write an export in the published layout."""
    load_published: str | None = None
    """fn(root, device, dtype, runtime) -> nn.Module: the network of a published folder, unimported (with
    the attention settings of the model section `runtime`, if given)."""
    step_cache_fits: Mapping[tuple[int, int], str] = field(default_factory=dict)
    """(hidden, layers) of a published size -> the name of its step-cache rescale polynomial."""
    profile_defaults: Mapping[str, Any] = field(default_factory=dict)
    """Settings (dotted field -> value) a profile of this family's presets needs besides the model section
    (its objective)."""
    condition_latents: str | None = None
    """Image-to-video (a model with condition_channels > 0): fn(tokenizer, first_frame (B, 3, H, W) in
    [-1, 1], frames) -> the condition latents (B, condition_channels, T, h, w) the network reads beside the
    noisy latents, as the family's published pipeline builds them."""
    image_encoder: str | None = None
    """Image-to-video with `image_dim`: "module:Class" of the family's image encoder, built as
    Class(path (tokenizer.image_encoder), device) with `.width` and `.encode(images)` -> (B, L, width)
    float32, as the family's pipeline embeds an image; None: CLIP's penultimate states (Wan2.1-I2V,
    `tokenizers.image_condition.ImageEncoder`)."""
    image_fit: str = "resize"
    """How the family's pipeline fits `infer --image` to the video's size: "resize" (diffusers'
    VideoProcessor.preprocess stretches it; the image encoder sees the image as given, Wan) or "crop"
    (resized to cover the size and centre-cropped first, and the image encoder sees that crop:
    HunyuanVideo-1.5)."""
    image_size: Callable[[Any, int, int, int], tuple[int, int]] | None = None
    """(model section, image height, image width, the VAE's spatial compression) -> the video's (height,
    width) the family's image-to-video pipeline samples an image at when given no size (HunyuanVideo-1.5:
    its bucket closest to the image's aspect); `infer --image` without infer.height/width takes it. None:
    the profile's size."""
    image_resample: str = "lanczos"
    """The PIL filter the family's pipeline resizes `infer --image` with (its VideoProcessor's `resample`:
    diffusers' default lanczos, LTX-2's bilinear)."""
    image_crf: int = 0
    """The H.264 CRF at which the family's pipeline re-compresses `infer --image` before fitting and
    encoding it, so that the image looks like the compressed video frames the model was trained on
    (LTX-2: 33, diffusers' `apply_image_conditioning_crf`); 0: the image as given."""
    image_tokens: int = 0
    """Tokens of the image embedding a model with `image_dim` reads per clip, as the family's image encoder
    gives them (FLOP and memory estimates of image-to-video; the embedding's width is `model.image_dim`)."""
    comfyui_lora: str | None = None
    """fn(module name in the network, e.g. `blocks.0.attn1.to_q`) -> the name of that layer in ComfyUI's
    model of the family (`blocks.0.self_attn.q`), a `Slot` where ComfyUI's layer is not the network's one
    for one (a part of a fused qkv), or None for a layer ComfyUI's model lacks: the keys of
    `vidforge model export --to comfyui` (`lora.comfyui`). None: ComfyUI has no model of it."""
    vae_compression: Callable[[Any], tuple[int, int]] | None = None
    """model section -> (temporal, spatial) compression of the VAE the family's published pipeline pairs
    with that model: a clip in pixels as latents (`bench plan --clip`; frames (k x temporal) + 1, sides
    multiples of spatial). None: the profile's tokenizer says."""
    media_defaults: Callable[[Any], Mapping[str, Any]] = lambda model: {}
    """model section -> the frame rate a model of that shape was trained on and samples at, as settings
    (`curation.fps`, `infer.fps`: dotted field -> value): `vidforge finetune` re-times its clips to it and plays its validation
    videos at it; a published folder's profile samples at it."""
    text_encoder: str | None = None
    """fn(profile) -> `vidforge.text.encoders.TextEncoderBase`: the family's own caption encoder, as its
    published pipeline encodes a caption (`text_encoder.kind=family`); None: the family has none."""
    negative_prompt: str | None = None
    """What the unconditional guidance branch reads when `infer.negative_prompt` is empty: None, the
    model's null caption (`drop_text`, which caption dropout trains); a string, that caption encoded, as
    the family's published pipeline does (`vidforge.sampling.negative.negative_caption`)."""
    layout_rules: Callable[[Any, Any], list[str]] = lambda profile, layout: []
    """(run profile, layout) -> what the family's network refuses at its first forward with them (packed
    rows, context parallel, caption dropout it has no code for), each as `field: what is wrong; what to
    change`: the layout rulebook (`vidforge.profile.layout_rules`) asks it, so such a profile is refused
    when it loads."""
    sampling_rules: Callable[[Any, Any], list[str]] = lambda profile, run: []
    """(run profile, `SamplingRun`) -> what `vidforge infer` of the family's model refuses (a sampling
    term its pipeline uses that is not built), each as `field: what is wrong; what to change`."""


def read_json(path: Path) -> dict[str, Any]:
    """A published folder's JSON object file (a config, an index of shards), or a UserInputError naming it:
    the one reader every family's folder reading and the safetensors streamer use."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise UserInputError(f"{path}: not readable JSON ({err}); download it again") from None
    if not isinstance(data, dict):
        raise UserInputError(f"{path}: expected a JSON object; download it again")
    return data


def names() -> list[str]:
    """Every registered family name."""
    return list(REGISTRY)


def family(name: str) -> FamilySpec:
    """The spec of family `name`; a UserInputError naming the registered ones if there is none."""
    if name not in REGISTRY:
        raise UserInputError(f"model.family: unknown {name!r}; use one of {', '.join(REGISTRY)}")
    spec = importlib.import_module(REGISTRY[name]).SPEC
    if spec.name != name:
        raise ValueError(f"{REGISTRY[name]}: registers {spec.name!r} under {name!r}")
    return spec


def presets() -> dict[str, dict[str, Any]]:
    """Every family's presets by name, each with its `family` field filled in."""
    table: dict[str, dict[str, Any]] = {}
    for name in REGISTRY:
        for preset, fields in family(name).presets.items():
            if preset in table:
                raise ValueError(f"preset {preset!r}: named by two families")
            table[preset] = {"family": name, **fields}
    return table


def load(path: str) -> Any:
    """The object a "package.module:attribute" string names."""
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


def read_published(folder: Path) -> Published | None:
    """The published folder's description by the first family that recognises it; None for none."""
    for name in REGISTRY:
        reader = family(name).read_published
        found = reader(folder) if reader is not None else None
        if found is not None:
            return found
    return None
