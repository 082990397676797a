"""HunyuanVideo-1.5's caption encoders and VAE as vidforge builds them from a published folder's profile
(`text_encoder.kind=family`, the family's own encoder; `tokenizer.kind=hunyuanvideo15`), held bitwise to
the loaded pipeline's own `encode_prompt` (joined by `captions.join_caption`) and its VAE encode/decode
with the scaling it applies; a profile asking for an encoder its family lacks, or leaving the MLLM no
tokens, is refused in one line."""

import pytest
import torch
from diffusers import HunyuanVideo15Pipeline
from diffusers.pipelines.hunyuan_video1_5.pipeline_hunyuan_video1_5 import extract_glyph_texts
from hunyuan15_fixtures import SCALING

from vidforge.errors import UserInputError
from vidforge.families.hunyuan15.captions import join_caption
from vidforge.families.hunyuan15.text_encoder import glyph_text
from vidforge.profile.loading import validate_profile
from vidforge.text import build_text_encoder
from vidforge.tokenizers import build_tokenizer
from vidforge.weights.weights_folder import find_weights, published_profile

# quoted glyph text twice (straight and curly quotes, one repeated), an empty caption, none quoted
CAPTIONS = ['a shop sign reading "OPEN" beside “SALE” and "OPEN"', "", "a cat walks on the grass"]


@pytest.fixture(scope="module")
def published(hunyuan15_folder):
    root = hunyuan15_folder()
    sets = ["text_encoder.device=cpu", "tokenizer.device=cpu"]
    return published_profile(find_weights(root).published, sets), HunyuanVideo15Pipeline.from_pretrained(root)


def test_glyph_text_is_the_pipelines():
    for caption in [*CAPTIONS, '"a" "b" "a"', 'one "x"', "“curly” only", 'unclosed "quote']:
        assert glyph_text(caption) == extract_glyph_texts(caption)


def test_captions_are_the_pipelines_encode_prompt(published):
    profile, pipe = published
    assert (profile.text_encoder.kind, profile.text_encoder.max_length) == ("family", 1000 + 256)
    encoder = build_text_encoder(profile)
    with torch.no_grad():
        ours, mask = encoder._encode_batch(CAPTIONS)
        theirs, theirs_mask = join_caption(
            *pipe.encode_prompt(CAPTIONS, device="cpu", batch_size=len(CAPTIONS))
        )
    assert ours.shape == (3, 1256, 24) and torch.equal(ours, theirs) and torch.equal(mask, theirs_mask)
    assert mask[0, 1000:].any() and not mask[1:, 1000:].any()  # glyph states of the quoting caption only
    # what shards store: float16, zeros past each caption
    stored, stored_mask = encoder.encode(CAPTIONS)
    assert torch.equal(torch.from_numpy(stored), (theirs * theirs_mask[..., None]).half())
    assert torch.equal(torch.from_numpy(stored_mask), theirs_mask)
    assert encoder.describe()["width"] == profile.model.text_dim


def test_vae_is_the_pipelines(published):
    profile, pipe = published
    assert profile.tokenizer.kind == "hunyuanvideo15"
    vae = build_tokenizer(profile, "cpu")
    assert (vae.temporal_compression, vae.spatial_compression, vae.scaling) == (4, 16, SCALING)
    video = torch.rand(1, 3, 9, 32, 48, generator=torch.Generator().manual_seed(0)) * 2 - 1
    latents = vae.encode(video)
    with torch.no_grad():
        theirs = (
            pipe.vae.encode(video).latent_dist.mode() * pipe.vae.config.scaling_factor
        )  # the I2V pipeline's
        decoded = pipe.vae.decode(latents / pipe.vae.config.scaling_factor).sample  # both pipelines' decode
    assert latents.shape == (1, 4, 3, 2, 3) and torch.equal(latents, theirs)
    assert torch.equal(vae.decode(latents), decoded)


def test_an_encoder_the_family_lacks_or_no_mllm_tokens_is_refused(published):
    profile, _ = published
    wan = validate_profile({"model": {"preset": "wan2.1-1.3b"}, "text_encoder": {"kind": "family"}}, "wan")
    with pytest.raises(UserInputError, match="text_encoder.kind: the wan family has no encoder of its own"):
        build_text_encoder(wan)
    short = profile.model_copy(
        update={"text_encoder": profile.text_encoder.model_copy(update={"max_length": 256})}
    )
    with pytest.raises(UserInputError, match="text_encoder.max_length: 256 leaves no MLLM tokens"):
        build_text_encoder(short)
