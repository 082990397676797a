"""The wan family: Wan2.1's text-to-video transformer (`vidforge.families.wan.network`, diffusers'
`WanTransformer3DModel` module for module, so published weights load by name), and how a diffusers
download of it (a transformer folder, or a whole pipeline: model_index.json beside transformer/, vae/,
text_encoder/ (umT5), tokenizer/, scheduler/) maps to a profile: rectified flow predicting the velocity,
the scheduler's shift, the pipeline's VAE and umT5 with its 512-token captions. Wan2.2 TI2V-5B is the same
block over the Wan2.2 VAE (48 channels, 4x16x16); its pipeline's model_index.json sets expand_timesteps
(first-frame image conditioning: `model.expand_timesteps`). Wan2.1-I2V's transformer (in_channels 36 = 16
predicted + 20 condition, image_dim, added_kv_proj_dim) is the same family with model.condition_channels
and model.image_dim; its pipeline's image_encoder/ (CLIP vision) becomes tokenizer.image_encoder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vidforge.errors import UserInputError
from vidforge.families import FamilySpec, Published, read_json
from vidforge.families.both_tasks import BOTH_TASKS
from vidforge.families.wan import experts as wan_experts
from vidforge.families.wan.model import WanModel

CLASS_NAME = "WanTransformer3DModel"
CONFIG = "config.json"
PIPELINE_INDEX = "model_index.json"
PIPELINE_PARTS = ("transformer", "vae", "text_encoder", "tokenizer", "scheduler", "image_encoder")
FREQ_DIM = 256  # sinusoidal features of the timestep (diffusers' freq_dim)
EPS = 1e-6  # every norm of Wan2.1 (diffusers' eps)
CAPTION_TOKENS = 512  # WanPipeline's max_sequence_length: umT5 states padded with zeros to 512
# How diffusers' Wan pipelines sample by default (the two-expert guidance scales are in wan_experts; the
# flow shift is the folder's scheduler_config.json's; its UniPCMultistepScheduler, every published Wan
# folder's, is the flow objective's default sampler, unipc)
GUIDANCE = 5.0  # WanPipeline's and WanImageToVideoPipeline's guidance_scale
NEGATIVE_PROMPT = ""  # their `negative_prompt or ""`: the empty caption encoded, never zeros
FPS, FPS_TI2V = 16, 24  # the frame rate of their model cards' export_to_video: Wan2.1 and A14B, TI2V-5B

# Config entries vidforge's wan family has no counterpart for: the value it must have.
FIXED_CONFIG: dict[str, Any] = {
    "freq_dim": FREQ_DIM,
    "eps": EPS,
    "pos_embed_seq_len": None,  # FLF2V's table over two images' tokens
}

# What Wan2.1 T2V's two sizes share: umT5 text (4096), 16 latent channels, patch 1x2x2 (the default),
# heads of 128, a LayerNorm before cross-attention. Parameter counts: wan2.1-1.3b 1.42e9, wan2.1-14b 14.3e9.
WAN2_1: dict[str, Any] = {
    "architecture": "dit",
    "in_channels": 16,
    "text_dim": 4096,
    "cross_attn_norm": True,
}
PRESETS: dict[str, dict[str, Any]] = {
    # Wan2.1 T2V, the Wan2.1-T2V-{1.3B,14B}-Diffusers transformer configs.
    "wan2.1-1.3b": {**WAN2_1, "layers": 30, "hidden": 1536, "heads": 12, "mlp_hidden": 8960},
    "wan2.1-14b": {**WAN2_1, "layers": 40, "hidden": 5120, "heads": 40, "mlp_hidden": 13824},
    **wan_experts.PRESETS,  # Wan2.2 T2V-A14B: two experts of Wan2.1-14B's shape
}

# Wan2.2 TI2V-5B, the Wan2.2-TI2V-5B-Diffusers transformer config: Wan2.1's block at 30 x 3072, 24 heads
# of 128, FFN 14336, over the Wan2.2 VAE's 48 latent channels; 5.0e9 parameters.
PRESETS["wan2.2-ti2v-5b"] = {
    **WAN2_1, "in_channels": 48, "layers": 30, "hidden": 3072, "heads": 24, "mlp_hidden": 14336,
    "expand_timesteps": True,
}  # fmt: skip


def frame_rate(expand_timesteps: bool) -> int:
    """The frame rate a Wan model was trained on and samples at: TI2V-5B (expand_timesteps) 24, else 16."""
    return FPS_TI2V if expand_timesteps else FPS


def media_defaults(model: Any) -> dict[str, Any]:
    """`frame_rate` of a `model` section as settings: finetune re-times clips to it, infer writes it."""
    fps = frame_rate(model.expand_timesteps)
    return {"curation.fps": fps, "infer.fps": fps}


def transformer_folder(src: Path) -> Path:
    """src itself, or src/transformer for a whole diffusers pipeline."""
    if not (src / CONFIG).is_file() and (src / "transformer" / CONFIG).is_file():
        return src / "transformer"
    return src


def pipeline_parts(src: Path) -> dict[str, Path]:
    """The component folders of a whole diffusers pipeline folder by name; empty for anything else."""
    if not (src / PIPELINE_INDEX).is_file():
        return {}
    return {name: src / name for name in PIPELINE_PARTS if (src / name).is_dir()}


def model_fields(config: dict[str, Any], where: Path) -> dict[str, Any]:
    """The profile's `model` fields of a diffusers WanTransformer3DModel config (not yet validated)."""
    if config.get("_class_name") != CLASS_NAME:
        raise UserInputError(
            f"{where}: _class_name is {config.get('_class_name')!r}, not {CLASS_NAME}; point at the "
            "transformer/ folder of a Wan2.1 diffusers download"
        )
    for key, value in FIXED_CONFIG.items():
        if config.get(key, value) != value:
            raise UserInputError(
                f"{where}: {key}={config[key]!r} cannot be represented (vidforge's wan family is Wan2.1 "
                f"text-to-video with {key}={value!r}); use a Wan2.1 T2V transformer"
            )
    heads, head_dim = config.get("num_attention_heads", 40), config.get("attention_head_dim", 128)
    channels, image = image_fields(config, heads * head_dim, where)
    return {
        "preset": None,
        "family": "wan",
        "layers": config.get("num_layers", 40),
        "hidden": heads * head_dim,
        "heads": heads,
        "mlp_hidden": config.get("ffn_dim", 13824),
        "patch": config.get("patch_size", [1, 2, 2]),
        "in_channels": channels,
        "text_dim": config.get("text_dim", 4096),
        "cross_attn_norm": config.get("cross_attn_norm", True),
        **image,
    }


def image_fields(config: dict[str, Any], hidden: int, where: Path) -> tuple[int, dict[str, int]]:
    """The latent channels and the image-to-video fields of a config: I2V's in_channels counts the
    condition (mask and first-frame latent) after the out_channels it predicts; its image embedding
    (image_dim) is projected to the model width, which added_kv_proj_dim then is."""
    out = config.get("out_channels") or config.get("in_channels", 16)
    condition = config.get("in_channels", 16) - out
    if condition < 0:
        raise UserInputError(
            f"{where}: in_channels={config.get('in_channels')} < out_channels={out}; not a Wan transformer config"
        )
    image_dim, added = config.get("image_dim"), config.get("added_kv_proj_dim")
    if (image_dim is None) != (added is None) or added not in (None, hidden):
        raise UserInputError(
            f"{where}: image_dim={image_dim} with added_kv_proj_dim={added} cannot be represented (Wan2.1-I2V "
            f"has both, added_kv_proj_dim = the width {hidden}); use a Wan2.1 T2V or I2V transformer"
        )
    return out, {"condition_channels": condition, "image_dim": image_dim or 0}


def diffusers_image_config(model: Any) -> dict[str, Any]:
    """The config entries of `image_fields`, from the `model` section (the export's)."""
    return {
        "in_channels": model.in_channels + model.condition_channels,
        "out_channels": model.in_channels,
        "image_dim": model.image_dim or None,
        "added_kv_proj_dim": model.hidden if model.image_dim else None,
    }


def _vae_compression(vae: Path) -> int:
    """AutoencoderKLWan's spatial compression: its config's scale_factor_spatial (diffusers >= 0.35), or
    one 2x downsampling between each of its levels."""
    config = read_json(vae / CONFIG) if (vae / CONFIG).is_file() else {}
    return int(config.get("scale_factor_spatial", 2 ** (len(config.get("dim_mult", [1, 2, 4, 4])) - 1)))


def _vae_temporal_compression(vae: Path) -> int:
    """AutoencoderKLWan's temporal compression: scale_factor_temporal, or 2x per temporal downsampling."""
    config = read_json(vae / CONFIG) if (vae / CONFIG).is_file() else {}
    steps = sum(bool(d) for d in config.get("temperal_downsample", [False, True, True]))
    return int(config.get("scale_factor_temporal", 2**steps))


def expands_timesteps(src: Path) -> bool:
    """Whether a pipeline folder's model_index.json sets expand_timesteps (Wan2.2 TI2V)."""
    index = src / PIPELINE_INDEX
    return index.is_file() and bool(read_json(index).get("expand_timesteps"))


def read_published(src: Path) -> Published | None:
    """A diffusers Wan transformer or pipeline folder as a profile reads it; None when `src` holds no
    WanTransformer3DModel config."""
    folder = transformer_folder(src)
    if not (folder / CONFIG).is_file() or read_json(folder / CONFIG).get("_class_name") != CLASS_NAME:
        return None
    model = model_fields(read_json(folder / CONFIG), folder / CONFIG)
    defaults: dict[str, Any] = {
        "diffusion.objective": "flow",
        "diffusion.flow_prediction": "velocity",
        "diffusion.guidance": GUIDANCE,
    }
    parts = {name: path.resolve() for name, path in pipeline_parts(src).items()}
    scheduler = parts.get("scheduler")
    if scheduler is not None and (scheduler / "scheduler_config.json").is_file():
        shift = read_json(scheduler / "scheduler_config.json").get("flow_shift")
        if shift is not None:
            defaults["diffusion.flow_shift"] = float(shift)
    if "vae" in parts:
        defaults["tokenizer.kind"] = "wan"
        defaults["tokenizer.path"] = str(parts["vae"])
        defaults["tokenizer.spatial_compression"] = _vae_compression(parts["vae"])
        defaults["tokenizer.temporal_compression"] = _vae_temporal_compression(parts["vae"])
    if "text_encoder" in parts:
        defaults["text_encoder.kind"] = "t5"
        defaults["text_encoder.path"] = str(parts["text_encoder"])
        defaults["text_encoder.max_length"] = CAPTION_TOKENS
        if "tokenizer" in parts:
            defaults["text_encoder.tokenizer_path"] = str(parts["tokenizer"])
    if "image_encoder" in parts:  # Wan2.1-I2V's CLIP
        defaults["tokenizer.image_encoder"] = str(parts["image_encoder"])
    if expands_timesteps(src):
        model["expand_timesteps"] = True
        defaults.update(BOTH_TASKS)  # a TI2V folder keeps both of its tasks
    defaults["infer.fps"] = frame_rate(bool(model.get("expand_timesteps")))
    published = Published("wan", src, folder, model, defaults, "flow")
    return wan_experts.read_experts(src, published, read_json, model_fields)  # Wan2.2 A14B's two


def block_scopes(cfg: Any) -> tuple[tuple[str, ...], int]:
    """Full attention; six modulation vectors (shift, scale, gate for attention and feed-forward)."""
    return ("full",), 6


def layout_rules(profile: Any, layout: Any) -> list[str]:
    """The image cross-attention (`model.image_dim`: Wan2.1-I2V's add_k_proj/add_v_proj over the image
    embedding) has no tensor-parallel plan yet; FSDP shards it."""
    if not profile.model.image_dim or layout.tp == 1:
        return []
    return [
        f"parallel.tp: the image cross-attention (model.image_dim={profile.model.image_dim}) has no "
        f"tensor-parallel plan yet (tp={layout.tp}); set parallel.tp=1 (training shards it with FSDP)"
    ]


SPEC = FamilySpec(
    name="wan",
    model=WanModel,
    network="vidforge.families.wan.network:WanTransformer",
    presets=PRESETS,
    # `vidforge.families.wan.tensor_parallel`, the Megatron split: to_q/to_k/to_v and ffn.net.0.proj
    # column-wise, to_out.0 and ffn.net.2 row-wise; norm_q/norm_k (across all heads) split with the heads
    # they normalise (their statistics reduced over tp); the per-block table and the cross-attention
    # LayerNorm replicated; everything outside the blocks replicated.
    tensor_parallel="vidforge.families.wan.tensor_parallel:apply_wan_tp",
    tp_rules=(("scale_shift_table", "norm2."), ("to_out.0", "ffn.net.2"), ()),
    # diffusers' Wan trainers' choice: the attention projections.
    lora_targets=("to_q", "to_k", "to_v", "to_out.0"),
    block_scopes=block_scopes,
    layout_rules=layout_rules,
    # Wan2.1's VAE 4 x 8 x 8; Wan2.2's 4 x 16 x 16, which only TI2V-5B (the one Wan with per-token noise
    # levels, expand_timesteps) is paired with
    vae_compression=lambda model: (4, 16 if model.expand_timesteps else 8),
    read_published=read_published,
    published_class=CLASS_NAME,
    # (Wan2.2 A14B's two experts, or one network through wan_weights' import_wan / load_diffusers_wan)
    import_weights="vidforge.families.wan.expert_weights:import_wan_experts",
    export_weights="vidforge.families.wan.weights:export_wan",
    load_published="vidforge.families.wan.expert_weights:load_wan_experts",
    # TeaCache's fits of Wan2.1's published sizes (`vidforge.sampling.step_cache`)
    step_cache_fits={(1536, 30): "wan2.1-t2v-1.3b", (5120, 40): "wan2.1-t2v-14b"},
    profile_defaults={"diffusion.objective": "flow"},
    # 16 fps video (24 for TI2V-5B), as the pipelines' model cards write it; musubi-tuner asks for 16 fps
    # clips of Wan2.1
    media_defaults=media_defaults,
    negative_prompt=NEGATIVE_PROMPT,
    # Wan2.1-I2V's [first frame, zeros...] latents after the first frame's mask (WanImageToVideoPipeline's)
    condition_latents="vidforge.families.wan.image_condition:condition_latents",
    # the names of ComfyUI's Wan model (the original Wan release's), for `model export --to comfyui`
    comfyui_lora="vidforge.families.wan.comfyui_names:comfyui_module",
    image_tokens=257,  # Wan2.1-I2V's CLIP ViT-H/14 at 224 px: 16 x 16 patches and the class token
)
