"""The hunyuan15 family: HunyuanVideo-1.5 (text- and image-to-video), diffusers'
`HunyuanVideo15Transformer3DModel` module for module. Its torch-free facts: the model section and the
published presets (`model`), how a published folder reads (`published`), LoRA's default targets; its code,
loaded by import path: the network (`network`), the caption layout (`captions`) and its encoders
(`text_encoder`), weight import/export (`weights`) and the tensor-parallel plan (`tensor_parallel`, without
sequence parallel).

`infer` samples the pipelines' latents, text-to-video and image-to-video (`image_condition`: the first
frame's condition latents and SigLIP's embedding, which tokenize keeps for training too). Context parallel
splits the video tokens only (cp_impl all-gather or ulysses). Not built yet: caption dropout, packed rows,
sequence parallel."""

from __future__ import annotations

from typing import Any

from vidforge.families import FamilySpec
from vidforge.families.hunyuan15.model import PRESETS, TITLE, HunyuanVideo15Model, default_size
from vidforge.families.hunyuan15.published import (
    CLASS_NAME,
    FPS,
    IMAGE_TOKENS,
    NEGATIVE_PROMPT,
    read_published,
)
from vidforge.families.plain_batches import PLAIN_BATCHES, plain_batch_problems

# The attention projections of both streams of every double-stream block (and, by the same names, of the
# caption refiner's blocks), as diffusers names them: the Wan family's choice with the caption stream's
# added. musubi-tuner adapts every Linear of the double-stream blocks (the feed-forwards and modulation
# too); train.lora.target_modules names those for a run that wants them.
LORA_TARGETS = ("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out")


def block_scopes(cfg: Any) -> tuple[tuple[str, ...], int]:
    """Full (joint) attention; six modulation vectors for each of the two streams."""
    return ("full",), 12


def no_sequence_parallel(tp: int) -> str:
    """The refusal of sequence parallel, which this family's tensor-parallel plan lacks (`tensor_parallel`
    says why), where the plan is applied (a profile asking for it is refused when it loads:
    `SPEC.sequence_parallel` is off)."""
    return (
        f"parallel.sequence_parallel: model.family=hunyuan15 has no sequence-parallel plan (tp={tp}); set "
        "parallel.sequence_parallel=false or leave it unset (tensor parallel then runs on whole rows)"
    )


def layout_rules(profile: Any, layout: Any) -> list[str]:
    """What the network refuses at its first forward, refused at load: re-gathering K/V under context
    parallel, packed rows and caption dropout (`plain_batches.PLAIN_BATCHES` avoid the last two). Sequence
    parallel, which the TP plan lacks, is the rulebook's (`SPEC.sequence_parallel`)."""
    problems = []
    if layout.cp > 1 and profile.parallel.cp_regather:
        problems.append(
            "parallel.cp_regather: HunyuanVideo-1.5's joint attention does not re-gather the video K/V in its "
            "backward (not built); set parallel.cp_regather=false"
        )
    return problems + plain_batch_problems(profile, "hunyuan15", TITLE)


SPEC = FamilySpec(
    name="hunyuan15",
    model=HunyuanVideo15Model,
    network="vidforge.families.hunyuan15.network:HunyuanVideo15Transformer",
    presets=PRESETS,
    tensor_parallel="vidforge.families.hunyuan15.tensor_parallel:apply_tp",
    sequence_parallel=False,
    tp_rules=(
        ("norm_q", "norm_k", "norm_added_q", "norm_added_k"),
        ("to_out.0", "to_add_out", "ff.net.2", "ff_context.net.2"),
        (),
        ("norm1.linear", "norm1_context.linear"),  # each stream's modulation: split, gathered again
    ),
    lora_targets=LORA_TARGETS,
    block_scopes=block_scopes,
    vae_compression=lambda model: (4, 16),  # AutoencoderKLHunyuanVideo15's
    read_published=read_published,
    published_class=CLASS_NAME,
    import_weights="vidforge.families.hunyuan15.weights:import_weights",
    export_weights="vidforge.families.hunyuan15.weights:export_weights",
    load_published="vidforge.families.hunyuan15.weights:load_published",
    profile_defaults={"diffusion.objective": "flow", **PLAIN_BATCHES},
    # the first frame's latents and mask, SigLIP's states of the image cropped to the video's size
    condition_latents="vidforge.families.hunyuan15.image_condition:condition_latents",
    image_encoder="vidforge.families.hunyuan15.image_condition:SiglipImageEncoder",
    image_fit="crop",
    # HunyuanVideo15ImageToVideoPipeline takes no size: its bucket closest to the image's aspect
    image_size=lambda model, height, width, spatial: default_size(
        model.target_size, (width, height), spatial
    ),
    image_tokens=IMAGE_TOKENS,
    media_defaults=lambda model: {"curation.fps": FPS, "infer.fps": FPS},
    negative_prompt=NEGATIVE_PROMPT,
    # Qwen2.5-VL's and Glyph-ByT5's states in one caption, as the pipelines' encode_prompt
    text_encoder="vidforge.families.hunyuan15.text_encoder:build",
    layout_rules=layout_rules,
    comfyui_lora="vidforge.families.hunyuan15.comfyui_names:comfyui_module",  # ComfyUI's names
)
