"""Image-to-video conditioning inputs against diffusers' own WanImageToVideoPipeline methods on a tiny random
I2V pipeline folder (tests/wan_i2v_fixtures.py): the condition latents and mask equal `prepare_latents`',
the image embedding equals `encode_image`'s, on the same image."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from vidforge.families.wan.image_condition import condition_channels, condition_latents
from vidforge.tokenizers.image_condition import ImageEncoder, preprocess_image
from vidforge.tokenizers.vae import DiffusersVAE

pytest.importorskip("transformers")
from wan_i2v_fixtures import CLIP_WIDTH, LATENT, MASK, save_tiny_wan_i2v_pipeline  # noqa: E402

HEIGHT, WIDTH, FRAMES = 32, 48, 5


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return save_tiny_wan_i2v_pipeline(tmp_path_factory.mktemp("Wan2.1-I2V-tiny-Diffusers"))


@pytest.fixture(scope="module")
def pipe(folder):
    from diffusers import WanImageToVideoPipeline

    return WanImageToVideoPipeline.from_pretrained(folder)


def _image():
    from PIL import Image

    pixels = np.random.default_rng(0).integers(0, 256, (50, 70, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def test_condition_latents_and_mask_equal_prepare_latents(folder, pipe):
    image = _image()
    expected_image = pipe.video_processor.preprocess(image, height=HEIGHT, width=WIDTH).float()
    ours_image = preprocess_image(image, HEIGHT, WIDTH, pipe.vae_scale_factor_spatial)
    assert torch.equal(ours_image, expected_image)
    noise, expected = pipe.prepare_latents(
        expected_image,
        1,
        LATENT,
        HEIGHT,
        WIDTH,
        FRAMES,
        torch.float32,
        "cpu",
        torch.Generator().manual_seed(0),
    )
    tokenizer = DiffusersVAE("wan", path=str(folder / "vae"))
    ours = condition_latents(tokenizer, ours_image, FRAMES)
    assert ours.shape == expected.shape == (1, MASK + LATENT, 2, HEIGHT // 8, WIDTH // 8)
    assert condition_channels(tokenizer) == MASK + LATENT
    assert torch.equal(ours[:, :MASK], expected[:, :MASK])
    # the VAE's normalisation divides by the std where the pipeline multiplies by its inverse: an ulp apart
    torch.testing.assert_close(ours[:, MASK:], expected[:, MASK:], rtol=1e-6, atol=1e-6)


def test_image_embedding_equals_encode_image(folder, pipe):
    image = _image()
    ours = ImageEncoder(folder / "image_encoder").encode([image])
    expected = pipe.encode_image(image, "cpu")
    assert ours.shape == (1, 17, CLIP_WIDTH)
    assert torch.equal(ours, expected)
    # an (H, W, 3) uint8 frame (what tokenize holds) embeds as the same picture does
    assert torch.equal(ImageEncoder(folder / "image_encoder").encode([np.array(image)]), expected)


def test_infer_with_an_image_samples_the_pipelines_latents(folder, pipe, tmp_path):
    """What `vidforge infer -c FOLDER --image PATH` samples (its profile as published: UniPC, the scheduler's
    shift, guidance with a negative caption) equals WanImageToVideoPipeline on the same image, caption
    embeddings and noise."""
    from vidforge.infer.image_condition import channel_condition
    from vidforge.infer.weights import find_weights, load_network, sampling_profile
    from vidforge.sampling.latents import initial_noise, sample_latents
    from vidforge.sampling.shape import check_shape
    from vidforge.text.encoders import build_text_encoder
    from vidforge.tokenizers.base import build_tokenizer

    path = tmp_path / "first.png"
    _image().save(path)
    sizes = [f"infer.height={HEIGHT}", f"infer.width={WIDTH}", f"infer.frames={FRAMES}", "diffusion.steps=3"]
    weights = find_weights(folder)
    profile = sampling_profile(weights, [*sizes, "infer.negative_prompt=blue"])
    assert (profile.diffusion.sampler, profile.diffusion.flow_shift) == ("unipc", 3.0)
    tokenizer = build_tokenizer(profile, device="cpu")
    shape = check_shape(profile, tokenizer)
    model = load_network(weights, "cpu")
    conditioning = channel_condition(profile, tokenizer, path)
    encoder = build_text_encoder(profile)
    text, mask = (torch.from_numpy(a) for a in encoder.encode(["a red square moving right"]))
    negative = tuple(torch.from_numpy(a) for a in encoder.encode(["blue"]))
    ours = sample_latents(
        model, profile, text.float(), mask, [7], shape, (negative[0].float(), negative[1]),
        forward=conditioning.forward(model),
    )  # fmt: skip
    from PIL import Image

    expected = pipe(
        image=Image.open(path), prompt_embeds=text.float(), negative_prompt_embeds=negative[0].float(),
        height=HEIGHT, width=WIDTH, num_frames=FRAMES, num_inference_steps=3,
        guidance_scale=profile.diffusion.guidance, latents=initial_noise([7], shape), output_type="latent",
    ).frames  # fmt: skip
    torch.testing.assert_close(ours, expected, rtol=2e-5, atol=2e-5)  # measured: 3.8e-6 apart


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(f).items()}


def test_import_export_is_bitwise_and_the_pipeline_loads_the_export(folder, tmp_path):
    """`model import` reads the I2V folder through the family spec (its CLIP included), `model export` gives
    every tensor back bitwise, and WanImageToVideoPipeline.from_pretrained loads a folder holding it."""
    import shutil

    from diffusers import WanImageToVideoPipeline
    from typer.testing import CliRunner

    from vidforge.cli.app import app
    from vidforge.profile import load_profile

    imported = tmp_path / "imported"
    result = CliRunner().invoke(app, ["model", "import", str(folder), "-o", str(imported)])
    assert result.exit_code == 0, result.output
    profile = load_profile(imported / "profile.yaml")
    model = profile.model
    assert (model.in_channels, model.condition_channels, model.image_dim) == (
        LATENT,
        MASK + LATENT,
        CLIP_WIDTH,
    )
    assert Path(profile.tokenizer.image_encoder) == folder.resolve() / "image_encoder"
    copy = shutil.copytree(folder, tmp_path / "pipeline", ignore=shutil.ignore_patterns("transformer"))
    result = CliRunner().invoke(
        app, ["model", "export", str(imported), "--to", "diffusers", "-o", str(copy / "transformer")]
    )
    assert result.exit_code == 0, result.output
    source, back = _tensors(folder / "transformer"), _tensors(copy / "transformer")
    assert sorted(source) == sorted(back)
    assert all(torch.equal(back[k].view(torch.uint8), t.view(torch.uint8)) for k, t in source.items())
    loaded = WanImageToVideoPipeline.from_pretrained(copy).transformer
    assert loaded.config.in_channels == 2 * LATENT + MASK and loaded.config.image_dim == CLIP_WIDTH
    assert all(torch.equal(t, source[name]) for name, t in loaded.state_dict().items())
