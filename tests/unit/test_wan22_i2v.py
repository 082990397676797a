"""Wan2.2 I2V-A14B (a tiny random two-expert image-to-video download, `wan22_i2v_fixtures`): the folder's
profile (two experts reading the mask and first-frame latent, no CLIP, the boundary and guidance of
the download), `vidforge infer --image`'s sampler against diffusers' WanImageToVideoPipeline with
`transformer_2` (same image, caption embeddings, noise and UniPC schedule; the expert and its guidance
switched inside the steps), and the preset against the published transformer config."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from vidforge.families import read_published
from vidforge.weights.weights_folder import published_profile

pytest.importorskip("transformers")
from wan22_i2v_fixtures import BOUNDARY, LATENT, MASK, save_tiny_wan22_i2v_pipeline  # noqa: E402

HEIGHT, WIDTH, FRAMES = 32, 48, 5
# shift 3, 4 steps: timesteps 999, 900 (high: 900 is the boundary itself) | 750, 500 (low)
SETS = [f"infer.height={HEIGHT}", f"infer.width={WIDTH}", f"infer.frames={FRAMES}", "diffusion.steps=4"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return save_tiny_wan22_i2v_pipeline(tmp_path_factory.mktemp("Wan2.2-I2V-A14B-tiny-Diffusers"))


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> Path:
    from PIL import Image

    pixels = np.random.default_rng(0).integers(0, 256, (50, 70, 3), dtype=np.uint8)
    path = tmp_path_factory.mktemp("image") / "first.png"
    Image.fromarray(pixels).save(path)
    return path


def test_the_folder_reads_as_two_image_to_video_experts_without_clip(folder) -> None:
    profile = published_profile(read_published(folder), SETS)
    model = profile.model
    assert (model.experts, model.boundary_ratio) == (2, BOUNDARY)
    assert (model.in_channels, model.condition_channels, model.image_dim) == (LATENT, MASK + LATENT, 0)
    assert profile.tokenizer.image_encoder is None
    assert (profile.diffusion.guidance, profile.diffusion.guidance_2) == (3.5, 3.5)  # Wan2.2 I2V-A14B's


def test_infer_with_an_image_equals_the_two_expert_image_to_video_pipeline(folder, image) -> None:
    """What `vidforge infer -c FOLDER --image PATH` samples, with a guidance scale per expert, equals
    WanImageToVideoPipeline(transformer_2, boundary_ratio) with guidance_scale_2; each expert runs at the
    steps on its side of the boundary."""
    from diffusers import WanImageToVideoPipeline
    from PIL import Image

    from vidforge.infer.image_condition import channel_condition
    from vidforge.infer.weights import find_weights, load_network, sampling_profile
    from vidforge.sampling.experts import sample_latents_experts
    from vidforge.sampling.latents import initial_noise
    from vidforge.sampling.shape import check_shape
    from vidforge.text.encoders import build_text_encoder
    from vidforge.tokenizers.base import build_tokenizer

    weights = find_weights(folder)
    sets = [*SETS, "diffusion.guidance=4.0", "diffusion.guidance_2=2.0", "text_encoder.max_length=8"]
    profile = sampling_profile(weights, sets)
    tokenizer = build_tokenizer(profile, device="cpu")
    shape = check_shape(profile, tokenizer)
    model = load_network(weights, "cpu")
    conditioning = channel_condition(profile, tokenizer, image)
    assert conditioning.embedding is None  # no CLIP: the mask and the first frame's latent alone
    encoder = build_text_encoder(profile)
    text, mask = (torch.from_numpy(a) for a in encoder.encode(["a red square moving right"]))
    neg, neg_mask = (torch.from_numpy(a) for a in encoder.encode(["blue"]))
    calls = {"high": 0, "low": 0}
    for name in calls:
        getattr(model, name).register_forward_hook(lambda *_, n=name: calls.__setitem__(n, calls[n] + 1))
    ours = sample_latents_experts(
        model, profile, text.float(), mask, [7], shape, (neg.float(), neg_mask), conditioning.forward
    )
    assert calls == {"high": 2, "low": 2}  # one batched call (both guidance rows) a step
    pipe = WanImageToVideoPipeline.from_pretrained(folder)
    theirs = pipe(
        image=Image.open(image), prompt_embeds=(text * mask[..., None]).float(),
        negative_prompt_embeds=(neg * neg_mask[..., None]).float(), height=HEIGHT, width=WIDTH,
        num_frames=FRAMES, num_inference_steps=4, guidance_scale=4.0, guidance_scale_2=2.0,
        latents=initial_noise([7], shape), output_type="latent",
    ).frames  # fmt: skip
    torch.testing.assert_close(ours, theirs, rtol=2e-5, atol=2e-5)


def test_default_infer_equals_the_pipeline_as_the_model_card_calls_it(
    folder, image, tmp_path, monkeypatch
) -> None:
    """`vidforge infer -c --image` with no sampling argument (`default_parity`) against
    WanImageToVideoPipeline with its defaults (the empty negative caption, the folder's scheduler and
    shift) and Wan2.2-I2V-A14B's model card's guidance_scale=3.5 (both experts; the pipeline's own
    default is 5.0); 16 fps."""
    from default_parity import PROMPT, noise, vidforge_infer
    from diffusers import WanImageToVideoPipeline
    from PIL import Image

    ours, fps, record = vidforge_infer(folder, tmp_path / "out", SETS, monkeypatch, image=image)
    assert (fps, record["negative_prompt"], record["guidance"], record["guidance_2"]) == (16, "", 3.5, 3.5)
    theirs = WanImageToVideoPipeline.from_pretrained(folder)(
        image=Image.open(image), prompt=PROMPT, height=HEIGHT, width=WIDTH, num_frames=FRAMES,
        num_inference_steps=4, guidance_scale=3.5, latents=noise(ours.shape[1:]), output_type="latent",
    ).frames  # fmt: skip
    torch.testing.assert_close(ours, theirs, rtol=2e-5, atol=2e-5)


def test_the_preset_has_the_published_shapes() -> None:
    """wan2.2-i2v-a14b against Wan2.2-I2V-A14B-Diffusers' transformer/config.json (transformer_2/'s is
    the same): the same model fields and the same tensors."""
    from diffusers import WanTransformer3DModel

    from vidforge.families.wan import model_fields
    from vidforge.models import build_model, model_config

    published = {
        "_class_name": "WanTransformer3DModel", "added_kv_proj_dim": None, "attention_head_dim": 128,
        "cross_attn_norm": True, "eps": 1e-06, "ffn_dim": 13824, "freq_dim": 256, "image_dim": None,
        "in_channels": 36, "num_attention_heads": 40, "num_layers": 40, "out_channels": 16,
        "patch_size": [1, 2, 2], "qk_norm": "rms_norm_across_heads", "rope_max_seq_len": 1024, "text_dim": 4096,
    }  # fmt: skip
    preset = model_config("wan2.2-i2v-a14b")
    read = model_fields(published, Path("config.json"))
    assert {k: getattr(preset, k) for k in read if k != "preset"} == {
        **{k: v for k, v in read.items() if k != "preset"},
        "patch": (1, 2, 2),
    }
    assert (preset.experts, preset.boundary_ratio, preset.condition_channels) == (2, 0.9, 20)
    config = {k: v for k, v in published.items() if not k.startswith("_")}
    with torch.device("meta"):
        ref = WanTransformer3DModel(**config)
    ours = build_model(preset, device="meta")
    assert {n: p.shape for n, p in ours.state_dict().items()} == {
        n: p.shape for n, p in ref.state_dict().items()
    }


def test_an_image_as_the_first_latent_frame_of_two_experts_is_refused_in_one_line() -> None:
    """I2V-A14B takes its image through condition channels (and needs one); two experts without them
    cannot take one as a first latent frame: the layout rulebook's sampling rules, asked before anything
    loads."""
    from vidforge.profile.layout_rules import SamplingRun, sampling_run_problems
    from vidforge.profile.loading import validate_profile

    profile = validate_profile({"model": {"preset": "wan2.2-i2v-a14b"}, "diffusion": {"objective": "flow"}})
    assert sampling_run_problems(profile, SamplingRun(1, image=True)) == []
    (needs,) = sampling_run_problems(profile, SamplingRun(1))
    assert needs.startswith("--image: this wan model is image-to-video") and "\n" not in needs
    model = {"preset": "wan2.2-i2v-a14b", "condition_channels": 0, "image_dim": 0, "expand_timesteps": True}
    first_frame = validate_profile({"model": model, "diffusion": {"objective": "flow"}})
    (refused,) = sampling_run_problems(first_frame, SamplingRun(1, image=True))
    assert refused.startswith("--image: a two-expert model samples from an image through")
