"""A published HunyuanVideo-1.5 folder as vidforge reads it (torch-free: JSON only). The diffusers layout
(hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-*): model_index.json beside transformer/, vae/
(AutoencoderKLHunyuanVideo15), text_encoder/ + tokenizer/ (Qwen2.5-VL's text model), text_encoder_2/ +
tokenizer_2/ (Glyph-ByT5, a T5 encoder over bytes), scheduler/ (flow matching, its shift), guider/
(classifier-free guidance, its scale), and for image-to-video image_encoder/ + feature_extractor/ (SigLIP).

What the pipelines fix in code rather than in the folder (diffusers 0.42's HunyuanVideo15Pipeline and
HunyuanVideo15ImageToVideoPipeline) is stated here once: caption lengths and the MLLM's prompt template
crop, the default negative prompt (empty), frames and steps; the frame rate is the one HunyuanVideo-1.5
generates at (24 fps, the image-to-video pipeline's example export)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vidforge.errors import UserInputError
from vidforge.families import Published, read_json
from vidforge.families.hunyuan15.model import FAMILY, default_size
from vidforge.families.plain_batches import PLAIN_BATCHES

CLASS_NAME = "HunyuanVideo15Transformer3DModel"
CONFIG = "config.json"
PIPELINE_INDEX = "model_index.json"
PIPELINE_CLASSES = ("HunyuanVideo15Pipeline", "HunyuanVideo15ImageToVideoPipeline")
MLLM_TOKENS = 1000  # the pipeline's tokenizer_max_length: Qwen2.5-VL states after the template's crop
MLLM_CROP = 108  # prompt_template_encode_start_idx: the system template's tokens cut from the front
GLYPH_TOKENS = 256  # tokenizer_2_max_length: ByT5 states of the quoted text
IMAGE_TOKENS = 729  # vision_num_semantic_tokens: SigLIP's 27 x 27 patches
NEGATIVE_PROMPT = ""  # encode_prompt's prompt when negative_prompt is None
FRAMES = 121  # __call__'s num_frames
STEPS = 50  # __call__'s num_inference_steps
FPS = 24
VAE_KIND = "hunyuanvideo15"  # tokenizer.kind of AutoencoderKLHunyuanVideo15
SCHEDULE_END = 0.0  # __call__'s sigmas: np.linspace(1.0, 0.0, num_inference_steps + 1)[:-1]
GUIDANCE = 7.5  # ClassifierFreeGuidance's default guidance_scale, for a folder without guider/


def transformer_folder(src: Path) -> Path:
    """src itself, or src/transformer for a whole pipeline folder."""
    if not (src / CONFIG).is_file() and (src / "transformer" / CONFIG).is_file():
        return src / "transformer"
    return src


def model_fields(config: dict[str, Any], where: Path) -> dict[str, Any]:
    """The family's `model` fields of a diffusers HunyuanVideo15Transformer3DModel config (not yet
    validated); a config vidforge cannot represent is refused naming the entry."""
    if config.get("_class_name") != CLASS_NAME:
        raise UserInputError(
            f"{where}: _class_name is {config.get('_class_name')!r}, not {CLASS_NAME}; point at a "
            "HunyuanVideo-1.5 diffusers folder or its transformer/"
        )
    if config.get("use_meanflow", False):
        raise UserInputError(
            f"{where}: use_meanflow=true (the super-resolution model's second timestep) is not built; "
            "use a HunyuanVideo-1.5 480p or 720p T2V or I2V transformer"
        )
    if config.get("qk_norm", "rms_norm") != "rms_norm":
        raise UserInputError(f"{where}: qk_norm={config['qk_norm']!r}; HunyuanVideo-1.5 has rms_norm")
    heads, head_dim = config.get("num_attention_heads", 16), config.get("attention_head_dim", 128)
    out = config.get("out_channels") or config.get("in_channels", 65)
    patch, patch_t = config.get("patch_size", 1), config.get("patch_size_t", 1)
    return {
        "family": FAMILY,
        "preset": None,
        "layers": config.get("num_layers", 54),
        "hidden": heads * head_dim,
        "heads": heads,
        "mlp_hidden": int(heads * head_dim * config.get("mlp_ratio", 4.0)),
        "refiner_layers": config.get("num_refiner_layers", 2),
        "patch": (patch_t, patch, patch),
        "in_channels": out,
        "condition_channels": config.get("in_channels", 65) - out,
        "text_dim": config.get("text_embed_dim", 3584),
        "text_2_dim": config.get("text_embed_2_dim", 1472),
        "text_2_tokens": GLYPH_TOKENS,
        "image_dim": config.get("image_embed_dim", 1152),
        "rope_axes": tuple(config.get("rope_axes_dim", (16, 56, 56))),
        "rope_theta": float(config.get("rope_theta", 256.0)),
        "task": config.get("task_type", "i2v"),
        "target_size": config.get("target_size", 640),
    }


def diffusers_config(model: Any, version: str) -> dict[str, Any]:
    """diffusers' config.json of the family's `model` section (the inverse of `model_fields`)."""
    pt, ph, pw = model.patch
    if ph != pw:
        raise UserInputError(
            f"model.patch={list(model.patch)}: diffusers' HunyuanVideo-1.5 has square patches"
        )
    return {
        "_class_name": CLASS_NAME,
        "_diffusers_version": version,
        "in_channels": model.in_channels + model.condition_channels,
        "out_channels": model.in_channels,
        "num_attention_heads": model.heads,
        "attention_head_dim": model.head_dim,
        "num_layers": model.layers,
        "num_refiner_layers": model.refiner_layers,
        "mlp_ratio": model.mlp_hidden / model.hidden,
        "patch_size": ph,
        "patch_size_t": pt,
        "qk_norm": "rms_norm",
        "text_embed_dim": model.text_dim,
        "text_embed_2_dim": model.text_2_dim,
        "image_embed_dim": model.image_dim,
        "rope_theta": model.rope_theta,
        "rope_axes_dim": list(model.rope_axes),
        "target_size": model.target_size,
        "task_type": model.task,
        "use_meanflow": False,
    }


@dataclass(frozen=True)
class Encoder:
    """A text or image encoder of the pipeline: its weights folder, its tokenizer's (or image processor's)."""

    path: Path
    preprocessor: Path | None
    tokens: int
    """The states per caption (image) the transformer reads."""


@dataclass(frozen=True)
class Pipeline:
    """What a published folder says beyond the transformer's shape, and what its pipeline fixes."""

    root: Path
    transformer: Path
    model: dict[str, Any]
    flow_shift: float | None
    """The scheduler's shift (None: a transformer folder alone)."""
    guidance: float
    vae: Path | None
    spatial_compression: int
    temporal_compression: int
    latent_scale: float
    """The VAE's scaling_factor: the transformer sees VAE latents times it."""
    mllm: Encoder | None
    glyph: Encoder | None
    image: Encoder | None
    default_size: tuple[int, int]
    """(height, width) text-to-video samples at (16:9); image-to-video picks the bucket of its image's aspect."""
    negative_prompt: str = NEGATIVE_PROMPT
    frames: int = FRAMES
    steps: int = STEPS
    fps: int = FPS
    mllm_crop: int = MLLM_CROP


def _part(root: Path, name: str) -> Path | None:
    return (root / name).resolve() if (root / PIPELINE_INDEX).is_file() and (root / name).is_dir() else None


def read_pipeline(src: Path) -> Pipeline | None:
    """The published folder at `src` (a pipeline or its transformer/ alone); None when it holds no
    HunyuanVideo15Transformer3DModel config."""
    folder = transformer_folder(src)
    if not (folder / CONFIG).is_file() or read_json(folder / CONFIG).get("_class_name") != CLASS_NAME:
        return None
    model = model_fields(read_json(folder / CONFIG), folder / CONFIG)
    scheduler, guider, vae = _part(src, "scheduler"), _part(src, "guider"), _part(src, "vae")
    shift = None
    if scheduler is not None and (scheduler / "scheduler_config.json").is_file():
        shift = float(read_json(scheduler / "scheduler_config.json").get("shift", 1.0))
    guidance = GUIDANCE
    if guider is not None and (guider / "guider_config.json").is_file():
        guidance = float(read_json(guider / "guider_config.json").get("guidance_scale", GUIDANCE))
    vae_config = read_json(vae / CONFIG) if vae is not None and (vae / CONFIG).is_file() else {}
    spatial = int(vae_config.get("spatial_compression_ratio", 16))

    def encoder(weights: str, pre: str, tokens: int) -> Encoder | None:
        path = _part(src, weights)
        return None if path is None else Encoder(path, _part(src, pre), tokens)

    return Pipeline(
        root=src,
        transformer=folder,
        model=model,
        flow_shift=shift,
        guidance=guidance,
        vae=vae,
        spatial_compression=spatial,
        temporal_compression=int(vae_config.get("temporal_compression_ratio", 4)),
        latent_scale=float(vae_config.get("scaling_factor", 1.03682)),
        mllm=encoder("text_encoder", "tokenizer", MLLM_TOKENS),
        glyph=encoder("text_encoder_2", "tokenizer_2", GLYPH_TOKENS),
        image=encoder("image_encoder", "feature_extractor", IMAGE_TOKENS),
        default_size=default_size(model["target_size"], patch=spatial),
    )


def profile_defaults(pipeline: Pipeline) -> dict[str, Any]:
    """Settings (dotted field -> value) that train and sample the folder's network as published, in the
    profile's existing fields: rectified flow predicting the velocity (noise - data: the scheduler's
    FlowMatchEuler step, the sampler flow-euler), its shift, the guider's scale, the frame rate; the folder's VAE and its two
    caption encoders (the family's own text encoder, which reads them from the folder); an image-to-video
    folder's image encoder."""
    settings: dict[str, Any] = {
        "diffusion.objective": "flow",
        "diffusion.flow_prediction": "velocity",
        "diffusion.sampler": "flow-euler",  # the folder's FlowMatchEulerDiscreteScheduler
        "diffusion.flow_schedule_end": SCHEDULE_END,
        "diffusion.guidance": pipeline.guidance,
        "infer.fps": pipeline.fps,
        **PLAIN_BATCHES,
    }
    if pipeline.flow_shift is not None:
        settings["diffusion.flow_shift"] = pipeline.flow_shift
    if pipeline.vae is not None:
        settings["tokenizer.kind"] = VAE_KIND
        settings["tokenizer.path"] = str(pipeline.vae)
        settings["tokenizer.spatial_compression"] = pipeline.spatial_compression
        settings["tokenizer.temporal_compression"] = pipeline.temporal_compression
    if pipeline.image is not None and pipeline.model["task"] == "i2v":  # SigLIP, feature_extractor/ beside it
        settings["tokenizer.image_encoder"] = str(pipeline.image.path)
    if pipeline.mllm is not None and pipeline.glyph is not None:
        # the spec's text_encoder: both encoders as the pipeline runs them
        settings["text_encoder.kind"] = "family"
        settings["text_encoder.path"] = str(pipeline.root.resolve())
        settings["text_encoder.max_length"] = pipeline.mllm.tokens + pipeline.glyph.tokens
    return settings


def read_published(src: Path) -> Published | None:
    """The folder as `vidforge.families` describes a published one (None when it is no HunyuanVideo-1.5
    folder): the transformer's `model` fields and the settings that train and sample it as published."""
    pipeline = read_pipeline(src)
    if pipeline is None:
        return None
    return Published(FAMILY, src, pipeline.transformer, pipeline.model, profile_defaults(pipeline), "flow")
