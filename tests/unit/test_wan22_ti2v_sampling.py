"""Wan2.2 TI2V sampling against diffusers' own pipelines on a tiny random TI2V folder (same weights, text
embeddings, noise and UniPC schedule): from an image, `WanImageToVideoPipeline(expand_timesteps=True)`
(the first latent frame is the image's latent, its tokens at t = 0); from text alone, `WanPipeline` with
expand_timesteps. The Wan2.2 VAE (is_residual, 4x16x16): our tokenizer's latents are the pipeline's
normalisation of diffusers' own encoding, and the first latent frame of a clip is its first frame's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from wan22_ti2v_fixtures import CHANNELS, save_tiny_ti2v_pipeline

from vidforge.infer.image import first_frame_latent
from vidforge.sampling.latents import sample_latents
from vidforge.text.encoders import build_text_encoder
from vidforge.tokenizers.base import build_tokenizer
from vidforge.tokenizers.image_condition import load_image, preprocess_image
from vidforge.weights.weights_folder import find_weights, load_published, published_profile

pytest.importorskip("transformers")

SIZE, FRAMES, STEPS, GUIDANCE, SEED = 64, 5, 3, 2.0, 7
SETS = [
    f"infer.height={SIZE}", f"infer.width={SIZE}", f"infer.frames={FRAMES}", f"diffusion.steps={STEPS}",
    f"diffusion.guidance={GUIDANCE}", "text_encoder.max_length=8",
]  # fmt: skip


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return save_tiny_ti2v_pipeline(tmp_path_factory.mktemp("Wan2.2-TI2V-tiny-Diffusers"))


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> Path:
    from PIL import Image

    pixels = np.random.default_rng(0).integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)
    path = tmp_path_factory.mktemp("image") / "first.png"
    Image.fromarray(pixels).save(path)
    return path


def _ours(folder: Path):
    profile = published_profile(find_weights(folder).published, SETS)
    return profile, build_tokenizer(profile), load_published(find_weights(folder).published)


def _texts(profile, prompt: str):
    encoder = build_text_encoder(profile)
    emb, mask = (torch.from_numpy(np.asarray(a)) for a in encoder.encode([prompt]))
    neg, neg_mask = (torch.from_numpy(np.asarray(a)) for a in encoder.encode(["blurry"]))
    return emb.float(), mask, (neg.float(), neg_mask)


def _zero_padded(emb, mask):
    """What Wan's pipeline makes of a caption's umT5 states: zeros after its real tokens."""
    return emb * mask[..., None]


def test_the_folder_reads_as_ti2v_with_its_wan22_vae(folder) -> None:
    profile, tokenizer, _ = _ours(folder)
    assert profile.model.expand_timesteps and profile.model.in_channels == CHANNELS
    assert (profile.tokenizer.spatial_compression, profile.tokenizer.temporal_compression) == (16, 4)
    assert tokenizer.latent_channels == CHANNELS and profile.diffusion.image_condition == 0.5
    assert profile.infer.fps == 24
    # and a finetune of it re-times its clips to 24 fps (the family's media defaults of this model)
    from vidforge.families import family

    assert family("wan").media_defaults(profile.model) == {"curation.fps": 24, "infer.fps": 24}


def test_vae_latents_are_the_pipelines_normalisation_and_the_first_frame_is_causal(folder) -> None:
    from diffusers import AutoencoderKLWan

    _, tokenizer, _ = _ours(folder)
    vae = AutoencoderKLWan.from_pretrained(folder / "vae").eval()
    video = torch.rand(1, 3, FRAMES, 32, 32, generator=torch.Generator().manual_seed(1)) * 2 - 1
    ours = tokenizer.encode(video)
    with torch.no_grad():
        z = vae.encode(video).latent_dist.mode()
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = 1.0 / torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    torch.testing.assert_close(ours, (z - mean) * std)  # pipeline_wan's prepare_latents
    with torch.no_grad():
        back = vae.decode(ours / std + mean).sample  # pipeline_wan's decode
    torch.testing.assert_close(tokenizer.decode(ours), back)
    # the causal encoder: the first latent frame is the first pixel frame's alone, so a clip's own first
    # latent frame is the latent of its first frame as an image (what TI2V training conditions on)
    alone = tokenizer.encode(video[:, :, :1])
    torch.testing.assert_close(alone, ours[:, :, :1], rtol=1e-5, atol=1e-6)


def test_image_to_video_equals_wan_image_to_video_pipeline(folder, image) -> None:
    from diffusers import WanImageToVideoPipeline
    from PIL import Image

    profile, tokenizer, model = _ours(folder)
    emb, mask, negative = _texts(profile, "a red square moving right")
    first = first_frame_latent(profile, tokenizer, image)
    shape = tokenizer.latent_shape(FRAMES, SIZE, SIZE)
    ours = sample_latents(model, profile, emb, mask, [SEED], shape, negative, first_frame=first)
    pipe = WanImageToVideoPipeline.from_pretrained(folder)
    assert pipe.config.expand_timesteps
    theirs = pipe(
        image=Image.open(image), prompt_embeds=_zero_padded(emb, mask),
        negative_prompt_embeds=_zero_padded(*negative), height=SIZE, width=SIZE, num_frames=FRAMES,
        num_inference_steps=STEPS, guidance_scale=GUIDANCE, output_type="latent",
        generator=torch.Generator().manual_seed(SEED),
    ).frames  # fmt: skip
    torch.testing.assert_close(ours[:, :, :1], first)
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


def test_text_to_video_equals_wan_pipeline_with_expand_timesteps(folder) -> None:
    from diffusers import WanPipeline

    profile, tokenizer, model = _ours(folder)
    emb, mask, negative = _texts(profile, "a blue circle")
    shape = tokenizer.latent_shape(FRAMES, SIZE, SIZE)
    ours = sample_latents(model, profile, emb, mask, [SEED], shape, negative)
    pipe = WanPipeline.from_pretrained(folder)
    assert pipe.config.expand_timesteps
    theirs = pipe(
        prompt_embeds=_zero_padded(emb, mask), negative_prompt_embeds=_zero_padded(*negative), height=SIZE,
        width=SIZE, num_frames=FRAMES, num_inference_steps=STEPS, guidance_scale=GUIDANCE, output_type="latent",
        generator=torch.Generator().manual_seed(SEED),
    ).frames  # fmt: skip
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode", ["image", "text"])
def test_default_infer_equals_the_pipelines_and_writes_24_fps(
    folder, image, mode, tmp_path, monkeypatch
) -> None:
    """`vidforge infer -c` (with `--image`, and without) and no sampling argument (`default_parity`)
    against WanImageToVideoPipeline(expand_timesteps) and WanPipeline with their defaults (the empty
    negative caption, guidance 5, the folder's UniPC and shift 5); TI2V-5B's 24 fps."""
    from default_parity import PROMPT, noise, vidforge_infer
    from diffusers import WanImageToVideoPipeline, WanPipeline
    from PIL import Image

    sets = [
        f"infer.height={SIZE}",
        f"infer.width={SIZE}",
        f"infer.frames={FRAMES}",
        f"diffusion.steps={STEPS}",
    ]
    path = image if mode == "image" else None
    ours, fps, record = vidforge_infer(folder, tmp_path / "out", sets, monkeypatch, image=path)
    assert (fps, record["negative_prompt"], record["guidance"]) == (24, "", 5.0)
    pipe = (WanImageToVideoPipeline if mode == "image" else WanPipeline).from_pretrained(folder)
    extra = {"image": Image.open(image)} if mode == "image" else {}
    theirs = pipe(
        prompt=PROMPT, height=SIZE, width=SIZE, num_frames=FRAMES, num_inference_steps=STEPS,
        latents=noise(ours.shape[1:]), output_type="latent", **extra,
    ).frames  # fmt: skip
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


def test_import_and_train_init_keep_the_folders_ti2v_settings(folder, tmp_path) -> None:
    from typer.testing import CliRunner

    from vidforge.cli.app import app
    from vidforge.cli.train_cmd import _init_profile
    from vidforge.profile import load_profile

    result = CliRunner().invoke(app, ["model", "import", str(folder), "-o", str(tmp_path / "imported")])
    assert result.exit_code == 0, result.output
    for profile in (
        load_profile(tmp_path / "imported" / "profile.yaml"),
        _init_profile(folder, None, [], None, False),
    ):
        assert profile.model.expand_timesteps and profile.model.in_channels == CHANNELS
        assert (profile.diffusion.image_condition, profile.diffusion.flow_shift) == (0.5, 5.0)
        assert (profile.tokenizer.kind, profile.tokenizer.spatial_compression) == ("wan", 16)


def test_an_image_of_another_size_is_read_as_the_pipelines_video_processor_reads_it(tmp_path) -> None:
    from diffusers.video_processor import VideoProcessor
    from PIL import Image

    path = tmp_path / "other.png"
    pixels = np.random.default_rng(1).integers(0, 256, (40, 50, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    theirs = VideoProcessor(vae_scale_factor=16).preprocess(Image.open(path), height=SIZE, width=SIZE)
    ours = preprocess_image(load_image(path), SIZE, SIZE, 16)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


def test_finetunes_next_commands_sample_a_ti2v_model_from_text_and_from_an_image(
    folder, image, tmp_path
) -> None:
    """`vidforge finetune`'s next commands for a model that kept both tasks (diffusion.image_condition > 0):
    the text-to-video line and the optional image-to-video one, which runs as printed with the first frame
    put in; a text-to-video fine-tune of it (image_condition 0) prints the first alone."""
    import shlex

    from typer.testing import CliRunner

    from vidforge import finetune
    from vidforge.cli.app import app
    from vidforge.files import FINETUNE_TRAIN
    from vidforge.profile import load_profile

    run = tmp_path / "run"  # a full fine-tune's folder: its weights in train/export
    export = run / FINETUNE_TRAIN / "export"
    result = CliRunner().invoke(app, ["model", "import", str(folder), "-o", str(export)])
    assert result.exit_code == 0, result.output
    profile = load_profile(export / "profile.yaml")
    text, from_image = finetune._next_commands(profile, folder, run, None, "a cat walks")
    assert shlex.split(text) == [
        "vidforge",
        "infer",
        "-c",
        str(run),
        "--prompt",
        "a cat walks",
        "-o",
        str(run / "samples"),
    ]
    argv = shlex.split(from_image)
    assert argv[:6] == ["vidforge", "infer", "-c", str(run), "--image", "FIRST_FRAME.png"]
    argv[argv.index("FIRST_FRAME.png")] = str(image)
    sets = [
        f"infer.height={SIZE}",
        f"infer.width={SIZE}",
        f"infer.frames={FRAMES}",
        f"diffusion.steps={STEPS}",
    ]
    result = CliRunner().invoke(app, [*argv[1:], *(a for s in sets for a in ("--set", s))])
    assert result.exit_code == 0, result.output
    assert len(list((run / "samples_from_image").glob("*.mp4"))) == 1
    text_only = profile.model_copy(
        update={"diffusion": profile.diffusion.model_copy(update={"image_condition": 0})}
    )
    assert finetune._next_commands(text_only, folder, run, None, "a cat walks") == [text]
