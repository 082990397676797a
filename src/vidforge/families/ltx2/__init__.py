"""The ltx2 family: LTX-2 and LTX-2.3 (Lightricks), the video path, diffusers' LTX2VideoTransformer3DModel
with the audio cross-attention off (`isolate_modalities=True`). Its torch-free facts: the model section and
the published preset (`model`), how a published folder reads (`published`: shape, flow objective, the
scheduler's resolution-dependent shift, VAE compression, Gemma 3 and its connector, the pipeline's fps,
guidance, size, frames, steps, negative prompt), LoRA's default targets; its code, loaded by import path:
the network (`network`), weight import/export (`weights`, bitwise, the audio stream's tensors carried
untouched) and the tensor- and sequence-parallel plan (`tensor_parallel`).

Its caption encoder (`text_encoder`: Gemma 3 through the text connector) and VAE (tokenizer.kind=ltx2video)
shard and tokenize as the pipeline encodes; `infer` samples the pipeline's video latents (its token-count
shift, shift_terminal and guidance rescale are diffusion settings a published folder's profile carries).
Image-to-video is first-frame conditioning (`model.expand_timesteps`, always on): `infer --image` samples
LTX2ImageToVideoPipeline's latents (the image re-compressed at its CRF, `FamilySpec.image_crf`, resized,
its latent the clean first frame at timestep 0), and training conditions a `diffusion.image_condition`
share of the clips on their own first latent frame, left out of the loss (Lightricks' trainer's
first_frame_conditioning_p; an LTX2ImageToVideoPipeline folder's profile sets it, `published`).

Not built yet: the audio stream (`model.audio` refused), packed rows and caption dropout
(refused at load: `layout_rules`), and spatio-temporal guidance (LTX-2.3's perturbed attention: refused
at infer, `sampling_rules`)."""

from __future__ import annotations

from typing import Any

from vidforge.families import FamilySpec
from vidforge.families.ltx2.model import PLAIN_BATCHES, PRESETS, LTX2Model
from vidforge.families.ltx2.published import CLASS_NAME, IMAGE_CRF, NEGATIVE_PROMPT, read_published

# The four projections of both attentions of every block (self-attention and the caption cross-attention),
# diffusers' names: what Lightricks' LTX-2 trainer (ltx-trainer's LoRA configs) and diffusers' LTX-2 LoRA
# loader target, the Wan family's choice. diffusion-pipe's LTX adapters also cover the feed-forwards
# (ff.net.0.proj, ff.net.2): train.lora.target_modules names those for a run that wants them.
LORA_TARGETS = ("to_q", "to_k", "to_v", "to_out.0")


def block_scopes(cfg: Any) -> tuple[tuple[str, ...], int]:
    """Full self-attention over the video tokens; six modulation vectors (nine with the caption's
    prompt modulation)."""
    return ("full",), 9 if cfg.prompt_modulation else 6


def layout_rules(profile: Any, layout: Any) -> list[str]:
    """What the network refuses at its first forward, refused at load: packed rows and caption dropout
    (`model.PLAIN_BATCHES` are the settings that avoid them)."""
    problems = []
    if profile.data.packing:
        problems.append(
            "data.packing: model.family=ltx2 runs plain batches only so far (packed rows are not built); "
            "set data.packing=false"
        )
    if profile.diffusion.caption_dropout > 0:
        problems.append(
            "diffusion.caption_dropout: LTX-2 trains its unconditional branch on its encoded empty prompt, "
            "not a dropped caption (not built yet); set diffusion.caption_dropout=0"
        )
    return problems


def sampling_rules(profile: Any, run: Any) -> list[str]:
    """The pipeline's default spatio-temporal guidance (STG, stg_scale 1 at block 28) perturbs a
    transformer built with perturbed_attn (LTX-2.3); it is not built, so such a model is refused rather
    than sampled differently from its pipeline (for LTX-2.0 STG changes nothing: no refusal)."""
    if not profile.model.perturbed_attention:
        return []
    return [
        "model.perturbed_attention: this LTX-2.3 model's pipeline samples with spatio-temporal guidance "
        "(STG), which vidforge does not build; set model.perturbed_attention=false to sample without it"
    ]


SPEC = FamilySpec(
    name="ltx2",
    model=LTX2Model,
    network="vidforge.families.ltx2.network:LTX2Transformer",
    presets=PRESETS,
    tensor_parallel="vidforge.families.ltx2.tensor_parallel:apply_tp",
    tp_rules=(("scale_shift_table",), ("to_out.0", "ff.net.2"), ()),
    lora_targets=LORA_TARGETS,
    block_scopes=block_scopes,
    vae_compression=lambda model: model.vae_scale[:2],  # (8, 32): frames, then height (= width)
    read_published=read_published,
    published_class=CLASS_NAME,
    import_weights="vidforge.families.ltx2.weights:import_weights",
    export_weights="vidforge.families.ltx2.weights:export_weights",
    load_published="vidforge.families.ltx2.weights:load_published",
    profile_defaults={"diffusion.objective": "flow", **PLAIN_BATCHES},
    media_defaults=lambda model: {"curation.fps": model.frame_rate, "infer.fps": round(model.frame_rate)},
    # LTX2ImageToVideoPipeline's default image_crf for a Gemma 3 checkpoint (resolve_default_image_crf)
    image_crf=IMAGE_CRF,
    image_resample="bilinear",  # the I2V pipeline's VideoProcessor(resample="bilinear")
    negative_prompt=NEGATIVE_PROMPT,
    # Gemma 3's stacked states through the text connector, as the pipeline's encode_prompt and connectors
    text_encoder="vidforge.families.ltx2.text_encoder:build",
    layout_rules=layout_rules,
    sampling_rules=sampling_rules,
    comfyui_lora="vidforge.families.ltx2.comfyui_names:comfyui_module",  # ComfyUI's names (the release's)
)
