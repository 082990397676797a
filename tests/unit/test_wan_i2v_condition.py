"""Image-to-video conditioning inputs against diffusers' own WanImageToVideoPipeline methods on a tiny random
I2V pipeline folder (tests/wan_i2v_fixtures.py): the condition latents and mask equal `prepare_latents`',
the image embedding equals `encode_image`'s, on the same image."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from vidforge.tokenizers.image_condition import (
    condition_channels,
    condition_latents,
    pipeline_image_encoder,
    preprocess_image,
)
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
    ours = pipeline_image_encoder(folder).encode([image])
    expected = pipe.encode_image(image, "cpu")
    assert ours.shape == (1, 17, CLIP_WIDTH)
    assert torch.equal(ours, expected)
    # an (H, W, 3) uint8 frame (what tokenize holds) embeds as the same picture does
    assert torch.equal(pipeline_image_encoder(folder).encode([np.array(image)]), expected)
