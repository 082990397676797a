"""README's HunyuanVideo-1.5 recipe ("Fine-tune HunyuanVideo-1.5": import, finetune, infer, export for ComfyUI)
at the published 480p text-to-video shape: 121 frames of 480x848 (HunyuanVideo15Pipeline's defaults: 121
frames, the transformer's target_size 640 at 16:9), 24 fps. By default `vidforge finetune --dry-run` of the
recipe as printed on a folder whose configs say the published 8.3B transformer (54 blocks of 2048, patch
1x1x1, 65 channels in, 32 out), VAE (32 latent channels, 16x spatial and 4x temporal) and encoders, sizing
49,290 tokens a clip and fitting one H200 (a dry run reads configs, never weights); and the recipe run for
real on a short clip (128x224, 9 frames) through a tiny folder in the published layout (patch 1, the
32-channel latents and 16x VAE, tiny widths): import, a finetune step, infer with the LoRA (its latents equal
to HunyuanVideo15Pipeline's with diffusers' own load of the adapter), the ComfyUI export.
VIDFORGE_TEST_RECIPES=1 also runs the recipe for real at 121x480x848 (minutes of VAE on 2 cores)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hunyuan15_fixtures import SCALING, pipeline_parts, reference_transformer  # noqa: E402
from recipes import CAPTIONS, HERE, assert_trained, finetune, invoke, video_facts, write_videos  # noqa: E402

FRAMES, HEIGHT, WIDTH, FPS = 121, 480, 848, 24  # HunyuanVideo15Pipeline's defaults for the 480p folder
RECIPE = ("--profile", "dit1b_1xh200", "--set", f"data.buckets=[[{HEIGHT},{WIDTH}]]", "--set",
          f"data.frame_buckets=[{FRAMES}]")  # fmt: skip
# 121 frames through the 4x temporal, 16x spatial VAE and the 1x1x1 patch: 31 x 30 x 53
TOKENS = ((FRAMES - 1) // 4 + 1) * (HEIGHT // 16) * (WIDTH // 16)
# diffusers' convert_hunyuan_video1_5_to_diffusers.py, TRANSFORMER_CONFIGS["480p_t2v"]; the VAE's and the
# encoders' published widths (Qwen2.5-VL-7B's text model, Glyph-SDXL-v2's ByT5)
PUBLISHED = {
    "transformer": {"in_channels": 65, "out_channels": 32, "num_attention_heads": 16, "attention_head_dim": 128,
                    "num_layers": 54, "num_refiner_layers": 2, "mlp_ratio": 4.0, "patch_size": 1, "patch_size_t": 1,
                    "text_embed_dim": 3584, "text_embed_2_dim": 1472, "image_embed_dim": 1152,
                    "rope_axes_dim": [16, 56, 56], "rope_theta": 256.0, "target_size": 640},
    "vae": {"latent_channels": 32, "block_out_channels": [128, 256, 512, 1024, 1024], "layers_per_block": 2},
    "text_encoder": {"hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
                     "num_attention_heads": 28, "num_key_value_heads": 4},
    "text_encoder_2": {"d_model": 1472, "d_ff": 3584, "num_layers": 12, "num_heads": 6, "d_kv": 64},
}  # fmt: skip
PROMPT = CAPTIONS[0]  # the caption of the one training video


def published_layout(root: Path) -> Path:
    """A tiny HunyuanVideo15Pipeline folder in the published layout: the transformer's 1x1x1 patch and 65
    channels in (32 predicted, 33 condition), the VAE's 32 latent channels at 16x16x4, tiny widths."""
    from diffusers import AutoencoderKLHunyuanVideo15, HunyuanVideo15Pipeline

    parts = pipeline_parts("t2v")
    parts["transformer"] = reference_transformer("t2v", in_channels=65, out_channels=32, patch_size=1).float()
    parts["vae"] = AutoencoderKLHunyuanVideo15(
        latent_channels=32, block_out_channels=(8, 8, 16, 32, 64), layers_per_block=1, scaling_factor=SCALING
    )  # the thinnest whose last block holds 2 x 32 channels
    HunyuanVideo15Pipeline(**parts).save_pretrained(root)
    return root


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return published_layout(tmp_path_factory.mktemp("hy15") / "HunyuanVideo-1.5-480p_t2v")


def _videos(folder: Path, frames: int, height: int, width: int) -> Path:
    return write_videos(folder, (frames,), height, width, fps=FPS)


def test_readme_hunyuan15_recipe_dry_run_at_the_published_shape(folder, tmp_path) -> None:
    base = Path(shutil.copytree(folder, tmp_path / folder.name))
    for part, fields in PUBLISHED.items():  # the published sizes (the tiny weights are never read)
        config = json.loads((base / part / "config.json").read_text())
        (base / part / "config.json").write_text(json.dumps({**config, **fields}))
    out = tmp_path / "run"
    argv = ["--json", "finetune", str(_videos(tmp_path / "videos", FRAMES + 3, 32, 32)), "--base", str(base)]
    result = invoke(*argv, "-o", str(out), "--dry-run", *RECIPE, "--steps", "2000")
    plan = json.loads(result.output.strip().splitlines()[-1])["dry_run"]
    assert plan["model"] == "hunyuan15 54 layers x 2048" and plan["clip"] == f"{FRAMES}x{HEIGHT}x{WIDTH}"
    assert TOKENS == 49290 and plan["data.token_budget"] == TOKENS
    assert (
        plan["infer"] == f"{FRAMES}x{HEIGHT}x{WIDTH} at {FPS} fps" and plan["cluster.accelerator"] == "h200"
    )
    assert 0 < plan["memory_gib"] <= plan["memory_limit_gib"]  # one H200, by auto recompute
    assert plan["recompute"].startswith("auto recompute:") and "fits" in plan["recompute"]
    assert not out.exists()  # nothing run, nothing written


def _recipe(base: Path, tmp_path: Path, frames: int, height: int, width: int, *extra: str) -> None:
    """The recipe's commands as printed, at a clip of `frames` x `height` x `width` (and `extra` settings
    for finetune and infer)."""
    from vidforge.lora.comfyui import FILE

    export = tmp_path / "runs" / "hy15_export"
    invoke("model", "import", str(base), "-o", str(export), "--profile", "dit1b_1xh200")
    assert "family: hunyuan15" in (export / "profile.yaml").read_text()

    run, size = (
        tmp_path / "runs" / "hy15_lora",
        (f"data.buckets=[[{height},{width}]]", f"data.frame_buckets=[{frames}]"),
    )
    videos = _videos(tmp_path / "videos", frames + 3, height, width)
    args = ("--profile", "dit1b_1xh200", "--steps", "1", "--validate-every", "0")
    finetune(videos, base, run, *args, sets=(*HERE, *size, *extra))  # bf16 here, as on the H200
    assert_trained(run, 1)

    samples = tmp_path / "runs" / "hy15_samples"
    # the finetune run itself, as README passes it (its adapter is in train/export: files.weights_places)
    argv = ["infer", "-c", str(base), "--lora", str(run), "--prompt", PROMPT, "-o", str(samples)]
    invoke(
        *argv,
        "--height",
        str(height),
        "--width",
        str(width),
        "--frames",
        str(frames),
        "--steps",
        "1",
        sets=extra,
    )
    record = json.loads((samples / "samples.jsonl").read_text().splitlines()[0])
    assert (
        record["guidance"] == 6.0 and record["sampler"] == "flow-euler"
    )  # the folder's guider and scheduler
    assert video_facts(sorted(samples.glob("*.mp4"))[0]) == (FPS, frames, {(height, width)})

    comfy = tmp_path / "ComfyUI" / "models" / "loras" / "hy15_lora"
    invoke("model", "export", str(run), "--to", "comfyui", "-o", str(comfy))
    assert (comfy / FILE).is_file()


@pytest.mark.slow(minutes=1)
def test_readme_hunyuan15_recipe_runs_on_a_short_clip(folder, tmp_path) -> None:
    _recipe(folder, tmp_path, 5, 64, 112)  # 2 x 4 x 7 latent positions


@pytest.mark.timeout(2400)  # 8.5 minutes of VAE encoding alone on 2 loaded cores, then 49,290-token steps
@pytest.mark.skipif(
    os.environ.get("VIDFORGE_TEST_RECIPES") != "1",
    reason="minutes of VAE encoding: set VIDFORGE_TEST_RECIPES=1 to run README's HunyuanVideo-1.5 recipe at 121x480x848",
)
def test_readme_hunyuan15_recipe_runs_at_121x480x848(folder, tmp_path) -> None:
    _recipe(folder, tmp_path, FRAMES, HEIGHT, WIDTH, "tokenizer.tiling=true")  # the VAE in 256-pixel tiles
