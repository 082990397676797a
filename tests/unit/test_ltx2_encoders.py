"""LTX-2's caption encoder and VAE as vidforge builds them from a published folder's profile
(`text_encoder.kind=family`: Gemma 3 through the text connector; `tokenizer.kind=ltx2video`), held bitwise to
the loaded LTX2Pipeline's own `encode_prompt` followed by its `connectors` (the video caption and mask the
transformer reads), and to its VAE encode/decode with the pipeline's latent normalisation."""

import pytest
import torch
from diffusers import LTX2Pipeline

from vidforge.text import build_text_encoder
from vidforge.tokenizers import build_tokenizer
from vidforge.weights.weights_folder import find_weights, published_profile

CAPTIONS = ["a red square moving right", "", "  a blue circle  "]  # an empty one, one the pipeline strips


@pytest.fixture(scope="module")
def published(ltx2_folder):
    root = ltx2_folder()
    sets = ["text_encoder.device=cpu", "tokenizer.device=cpu"]
    return published_profile(find_weights(root).published, sets), LTX2Pipeline.from_pretrained(root)


def test_captions_are_the_pipelines_encode_prompt_through_its_connectors(published):
    profile, pipe = published
    assert (profile.text_encoder.kind, profile.text_encoder.max_length) == ("family", 1024)
    encoder = build_text_encoder(profile)
    with torch.no_grad():
        ours, mask = encoder._encode_batch(CAPTIONS)
        embeds, embeds_mask, _, _ = pipe.encode_prompt(
            CAPTIONS, do_classifier_free_guidance=False, device="cpu"
        )
        theirs, _, theirs_mask = pipe.connectors(embeds, embeds_mask, padding_side="left")
    assert ours.shape == (3, 1024, 16) and torch.equal(ours, theirs)
    assert torch.equal(mask, theirs_mask.bool())
    # what shards store: float16, zeros past each caption
    stored, stored_mask = encoder.encode(CAPTIONS)
    assert torch.equal(torch.from_numpy(stored), (theirs * theirs_mask[..., None]).half())
    assert torch.equal(torch.from_numpy(stored_mask), theirs_mask.bool())
    assert encoder.describe()["width"] == profile.model.text_dim


def test_vae_is_the_pipelines_with_its_latent_normalisation(published):
    profile, pipe = published
    assert profile.tokenizer.kind == "ltx2video"
    vae = build_tokenizer(profile, "cpu")
    assert (vae.temporal_compression, vae.spatial_compression) == (8, 32)
    video = torch.rand(1, 3, 9, 64, 96, generator=torch.Generator().manual_seed(0)) * 2 - 1
    latents = vae.encode(video)
    mean, std, scale = pipe.vae.latents_mean, pipe.vae.latents_std, pipe.vae.config.scaling_factor
    assert not torch.equal(mean, torch.zeros_like(mean))  # the fixture's statistics are not the identity
    with torch.no_grad():
        # the condition pipelines' encode (the posterior's mode, normalised) and every pipeline's decode
        theirs = pipe._normalize_latents(pipe.vae.encode(video).latent_dist.mode(), mean, std, scale)
        decoded = pipe.vae.decode(pipe._denormalize_latents(latents, mean, std, scale)).sample
    assert latents.shape == (1, 4, 2, 2, 3) and torch.equal(latents, theirs)
    assert torch.equal(vae.decode(latents), decoded)
