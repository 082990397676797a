"""A published LTX-2 folder as vidforge reads it (torch-free: JSON only). The diffusers layout
(Lightricks/LTX-2): model_index.json beside transformer/ (LTX2VideoTransformer3DModel, joint audio-video),
connectors/ (LTX2TextConnectors: the text encoder's stacked hidden states to the transformer's caption),
text_encoder/ + tokenizer/ (Gemma 3), vae/ (AutoencoderKLLTX2Video), scheduler/ (flow matching with a
resolution-dependent shift), and the audio stream's audio_vae/ and vocoder/, which the video path does not
read.

What diffusers 0.42's LTX2Pipeline fixes in code rather than in the folder is stated here once: the caption
length, the default negative prompt, size, frames, steps, frame rate and guidance scale."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vidforge.errors import UserInputError
from vidforge.families import Published, read_json
from vidforge.families.both_tasks import BOTH_TASKS
from vidforge.families.ltx2.model import FAMILY
from vidforge.families.plain_batches import PLAIN_BATCHES

CLASS_NAME = "LTX2VideoTransformer3DModel"
CONFIG = "config.json"
PIPELINE_INDEX = "model_index.json"
PIPELINE_CLASSES = ("LTX2Pipeline", "LTX2ImageToVideoPipeline", "LTX2ConditionPipeline")
IMAGE_TO_VIDEO = "LTX2ImageToVideoPipeline"
IMAGE_CRF = 33  # the I2V pipeline's H.264 re-compression of its image (Gemma 3 checkpoints: LTX-2, 2.3)
CAPTION_TOKENS = 1024  # __call__'s max_sequence_length: Gemma tokens per caption
NEGATIVE_PROMPT = ""  # encode_prompt's negative prompt when none is given
HEIGHT, WIDTH, FRAMES = 512, 768, 121  # __call__'s defaults (a checkpoint without a duration head)
STEPS = 30
FPS = 24  # __call__'s frame_rate, also what RoPE's time axis is given
GUIDANCE = 3.0  # __call__'s guidance_scale (its CFG mixes clean estimates, as vidforge's does)
GUIDANCE_RESCALE = 0.7  # __call__'s guidance_rescale, on the clean estimates
SCHEDULE_END = 0.0  # __call__'s sigmas: np.linspace(1.0, 1 / steps, steps), linspace(1, 0, steps + 1)[:-1]
VAE_KIND = "ltx2video"  # tokenizer.kind of AutoencoderKLLTX2Video
# __call__'s other guidance terms by default: STG (stg_scale 1 at block 28) perturbs only a transformer
# built with perturbed_attn (LTX-2.3; refused at infer, `sampling_rules`), a no-op otherwise; modality
# guidance (modality_scale 3) moves away from the audio-isolated prediction, which is the video path's
# own (no audio stream): a no-op here.

# Transformer config entries the video path is built for, with the value it is built for: a folder with
# another is refused naming the entry.
BUILT_FOR: dict[str, Any] = {
    "patch_size": 1, "patch_size_t": 1, "qk_norm": "rms_norm_across_heads", "activation_fn": "gelu-approximate",
    "norm_elementwise_affine": False, "attention_bias": True, "attention_out_bias": True,
    "timestep_scale_multiplier": 1000, "use_keyframes_abs_pos_embedding": False,
}  # fmt: skip


# Name parts of the published transformer's audio stream and cross-modal attention: tensors the video
# path does not read (an import carries them untouched; --init leaves them out of its match).
AUDIO_NAMES = ("audio_", "av_cross_attn_", "video_to_audio_", "video_a2v_")


def is_audio(key: str) -> bool:
    """Whether a published state-dict key belongs to the audio stream (or the cross-modal attention)."""
    return any(part.startswith(AUDIO_NAMES) for part in key.split("."))


def transformer_folder(src: Path) -> Path:
    """src itself, or src/transformer for a whole pipeline folder."""
    if not (src / CONFIG).is_file() and (src / "transformer" / CONFIG).is_file():
        return src / "transformer"
    return src


def model_fields(config: dict[str, Any], where: Path) -> dict[str, Any]:
    """The family's `model` fields of a diffusers LTX2VideoTransformer3DModel config (not yet validated); a
    config the video path is not built for is refused naming the entry."""
    if config.get("_class_name") != CLASS_NAME:
        raise UserInputError(
            f"{where}: _class_name is {config.get('_class_name')!r}, not {CLASS_NAME}; point at an LTX-2 "
            "diffusers folder or its transformer/"
        )
    for key, value in BUILT_FOR.items():
        if config.get(key, value) != value:
            raise UserInputError(
                f"{where}: {key}={config[key]!r} is not built (the LTX-2 video path has {key}={value!r})"
            )
    heads, head_dim = config.get("num_attention_heads", 32), config.get("attention_head_dim", 128)
    in_channels = config.get("in_channels", 128)
    if (config.get("out_channels") or in_channels) != in_channels:
        raise UserInputError(f"{where}: out_channels differs from in_channels; LTX-2 predicts what it reads")
    if config.get("cross_attention_dim", 4096) != heads * head_dim:
        raise UserInputError(f"{where}: cross_attention_dim is not the width heads x head_dim")
    if config.get("audio_cross_attn_mod", False) != config.get("cross_attn_mod", False):
        raise UserInputError(
            f"{where}: cross_attn_mod differs from audio_cross_attn_mod (the video stream then holds prompt "
            "modulation weights it does not use); not built"
        )
    return {
        "family": FAMILY,
        "preset": None,
        "layers": config.get("num_layers", 48),
        "hidden": heads * head_dim,
        "heads": heads,
        "in_channels": in_channels,
        "text_dim": config.get("caption_channels", 3840)
        if config.get("use_prompt_embeddings", True)
        else heads * head_dim,
        "rope_theta": float(config.get("rope_theta", 10000.0)),
        "rope_type": config.get("rope_type", "interleaved"),
        "rope_double_precision": config.get("rope_double_precision", True),
        "rope_base": (
            float(config.get("pos_embed_max_pos", 20)),
            float(config.get("base_height", 2048)),
            float(config.get("base_width", 2048)),
        ),
        "vae_scale": tuple(config.get("vae_scale_factors", (8, 32, 32))),
        "causal_offset": config.get("causal_offset", 1),
        "gated_attention": config.get("gated_attn", False),
        "prompt_modulation": config.get("cross_attn_mod", False),
        "prompt_modulation_per_step": config.get("use_prompt_adaln_single", True),
        "caption_projection": config.get("use_prompt_embeddings", True),
        "ff_bias": config.get("ff_bias", True),
        "eps": config.get("norm_eps", 1e-6),
        "perturbed_attention": config.get("perturbed_attn", False),
    }


@dataclass(frozen=True)
class Shift:
    """The scheduler's flow shift: with dynamic shifting, mu linear in the token count between
    (base_seq_len, base_shift) and (max_seq_len, max_shift), as the pipeline's calculate_shift; the
    exponential time shift t -> e^mu t / (1 + (e^mu - 1) t) is a constant shift of e^mu (linear: of mu).
    `terminal`: the scheduler's shift_terminal, its last sigma stretched to it (None: not stretched)."""

    dynamic: bool
    shift: float
    base_shift: float
    max_shift: float
    base_seq_len: int
    max_seq_len: int
    exponential: bool
    terminal: float | None

    def at(self, tokens: int) -> float:
        """The constant shift the pipeline samples `tokens` video tokens with."""
        if not self.dynamic:
            return self.shift
        slope = (self.max_shift - self.base_shift) / (self.max_seq_len - self.base_seq_len)
        mu = self.base_shift + slope * (tokens - self.base_seq_len)
        return math.exp(mu) if self.exponential else mu

    def settings(self, default_tokens: int) -> dict[str, Any]:
        """The profile's diffusion settings for this rule: the exponential dynamic shift as
        `flow_shift_tokens` (the shift follows each sample's token count, in training too: LTX-Video-
        Trainer's shifted logit-normal is this shift of the logit-normal), else the constant shift at the
        pipeline's default size; the terminal stretch."""
        settings: dict[str, Any] = {"diffusion.flow_shift": self.at(default_tokens)}
        if self.dynamic and self.exponential:
            rule = [self.base_seq_len, self.base_shift, self.max_seq_len, self.max_shift]
            settings["diffusion.flow_shift_tokens"] = rule
        if self.terminal is not None:
            settings["diffusion.flow_shift_terminal"] = self.terminal
        return settings


def read_shift(config: dict[str, Any]) -> Shift:
    return Shift(
        dynamic=bool(config.get("use_dynamic_shifting", False)),
        shift=float(config.get("shift", 1.0)),
        base_shift=float(config.get("base_shift", 0.95)),  # the pipeline's fallbacks
        max_shift=float(config.get("max_shift", 2.05)),
        base_seq_len=int(config.get("base_image_seq_len", 1024)),
        max_seq_len=int(config.get("max_image_seq_len", 4096)),
        exponential=config.get("time_shift_type", "exponential") == "exponential",
        terminal=config.get("shift_terminal"),
    )


@dataclass(frozen=True)
class Pipeline:
    """What a published folder says beyond the transformer's shape, and what its pipeline fixes."""

    root: Path
    transformer: Path
    model: dict[str, Any]
    shift: Shift | None
    """The scheduler's shift rule (None: a transformer folder alone)."""
    vae: Path | None
    spatial_compression: int
    temporal_compression: int
    latent_channels: int
    latent_scale: float
    """The VAE's scaling_factor, after its per-channel latents_mean/latents_std (buffers in its weights)."""
    text_encoder: Path | None
    tokenizer: Path | None
    connectors: Path | None
    text_layers: int
    """Gemma hidden states the connector stacks (text_proj_in_factor: the layers plus the embedding)."""
    image_to_video: bool = False
    """model_index.json names LTX2ImageToVideoPipeline."""
    caption_tokens: int = CAPTION_TOKENS
    negative_prompt: str = NEGATIVE_PROMPT
    size: tuple[int, int] = (HEIGHT, WIDTH)
    frames: int = FRAMES
    steps: int = STEPS
    fps: int = FPS
    guidance: float = GUIDANCE

    @property
    def default_tokens(self) -> int:
        """Video tokens at the pipeline's default size and frames (patch 1x1x1)."""
        frames = (self.frames - 1) // self.temporal_compression + 1
        return (
            frames * (self.size[0] // self.spatial_compression) * (self.size[1] // self.spatial_compression)
        )


def _part(root: Path, name: str) -> Path | None:
    return (root / name).resolve() if (root / PIPELINE_INDEX).is_file() and (root / name).is_dir() else None


def _config(folder: Path | None, name: str = CONFIG) -> dict[str, Any]:
    return read_json(folder / name) if folder is not None and (folder / name).is_file() else {}


def read_pipeline(src: Path) -> Pipeline | None:
    """The published folder at `src` (a pipeline or its transformer/ alone); None when it holds no
    LTX2VideoTransformer3DModel config."""
    src = Path(src)
    folder = transformer_folder(src)
    if not (folder / CONFIG).is_file() or read_json(folder / CONFIG).get("_class_name") != CLASS_NAME:
        return None
    index = read_json(src / PIPELINE_INDEX) if (src / PIPELINE_INDEX).is_file() else {}
    if index:
        if index.get("_class_name") not in PIPELINE_CLASSES:
            raise UserInputError(
                f"{src / PIPELINE_INDEX}: _class_name {index.get('_class_name')!r} is not one of "
                f"{', '.join(PIPELINE_CLASSES)}; point at the LTX-2 pipeline folder or its transformer/"
            )
    model = model_fields(read_json(folder / CONFIG), folder / CONFIG)
    scheduler, vae, connectors = _part(src, "scheduler"), _part(src, "vae"), _part(src, "connectors")
    shift = None
    if scheduler is not None and (scheduler / "scheduler_config.json").is_file():
        shift = read_shift(read_json(scheduler / "scheduler_config.json"))
    vae_config, connector_config = _config(vae), _config(connectors)
    if connector_config:
        per_modality = connector_config.get("per_modality_projections", False)
        width = connector_config.get("video_hidden_dim" if per_modality else "caption_channels", 3840)
        if width != model["text_dim"]:
            raise UserInputError(
                f"{connectors / CONFIG}: the connector's video caption is {width} wide, the transformer "
                f"reads {model['text_dim']}; the folder mixes two models"
            )
    scaling = vae_config.get("spatio_temporal_scaling", (True, True, True, True))
    scaling = (
        [scaling] * (len(vae_config.get("layers_per_block", (0,) * 5)) - 1)
        if isinstance(scaling, bool)
        else scaling
    )
    spatial = vae_config.get("spatial_compression_ratio") or vae_config.get("patch_size", 4) * 2 ** sum(
        scaling
    )
    temporal = vae_config.get("temporal_compression_ratio") or vae_config.get("patch_size_t", 1) * 2 ** sum(
        scaling
    )
    return Pipeline(
        root=src,
        transformer=folder,
        model=model,
        shift=shift,
        vae=vae,
        spatial_compression=int(spatial),
        temporal_compression=int(temporal),
        latent_channels=int(vae_config.get("latent_channels", model["in_channels"])),
        latent_scale=float(vae_config.get("scaling_factor", 1.0)),
        text_encoder=_part(src, "text_encoder"),
        tokenizer=_part(src, "tokenizer"),
        connectors=connectors,
        text_layers=int(connector_config.get("text_proj_in_factor", 49)),
        image_to_video=index.get("_class_name") == IMAGE_TO_VIDEO,
    )


def profile_defaults(pipeline: Pipeline) -> dict[str, Any]:
    """Settings (dotted field -> value) that train and sample the folder's network as published, in the
    profile's existing fields: rectified flow predicting the velocity (noise - data: the scheduler's
    FlowMatchEuler step, the sampler flow-euler over the pipeline's schedule), the scheduler's shift
    rule, the guidance scale and rescale, the steps, frame rate, size and frames of `__call__`'s defaults,
    plain batches without caption dropout (what the network runs so far); the folder's VAE and its caption
    encoder (Gemma 3 and the text connector); an image-to-video pipeline's first-frame conditioning."""
    settings: dict[str, Any] = {
        "diffusion.objective": "flow",
        "diffusion.flow_prediction": "velocity",
        "diffusion.sampler": "flow-euler",  # the folder's FlowMatchEulerDiscreteScheduler
        "diffusion.flow_schedule_end": SCHEDULE_END,
        "diffusion.guidance": pipeline.guidance,
        "diffusion.guidance_rescale": GUIDANCE_RESCALE,
        "diffusion.steps": pipeline.steps,
        "infer.fps": pipeline.fps,
        "infer.height": pipeline.size[0],
        "infer.width": pipeline.size[1],
        "infer.frames": pipeline.frames,
        **PLAIN_BATCHES,
    }
    if pipeline.image_to_video:
        # a folder saved as LTX2ImageToVideoPipeline keeps both tasks (Lightricks' trainer conditions
        # first_frame_conditioning_p = 0.1 of a text-to-video run's clips)
        settings.update(BOTH_TASKS)
    if pipeline.shift is not None:
        settings.update(pipeline.shift.settings(pipeline.default_tokens))
    if pipeline.vae is not None:
        settings["tokenizer.kind"] = VAE_KIND
        settings["tokenizer.path"] = str(pipeline.vae)
        settings["tokenizer.spatial_compression"] = pipeline.spatial_compression
        settings["tokenizer.temporal_compression"] = pipeline.temporal_compression
    if None not in (pipeline.text_encoder, pipeline.tokenizer, pipeline.connectors):
        # the spec's text_encoder: Gemma 3 and the connector
        settings["text_encoder.kind"] = "family"
        settings["text_encoder.path"] = str(pipeline.root.resolve())
        settings["text_encoder.max_length"] = pipeline.caption_tokens
    return settings


def read_published(src: Path) -> Published | None:
    """The folder as `vidforge.families` describes a published one (None when it is no LTX-2 folder)."""
    pipeline = read_pipeline(src)
    if pipeline is None:
        return None
    return Published(
        FAMILY,
        Path(src),
        pipeline.transformer,
        pipeline.model,
        profile_defaults(pipeline),
        "flow",
        unread=is_audio,
    )
