"""A published LTX-2 folder read into the ltx2 family's facts, and its transformer imported and exported
bitwise. The folder is a tiny random one saved by diffusers' LTX2Pipeline.save_pretrained (every component
by its own save_pretrained, model_index.json naming each, LTX2Pipeline.from_pretrained loads it); the facts
are held to what diffusers' pipeline computes from the same folder (its VAE's compression, its scheduler's
shift, its __call__ defaults)."""

from __future__ import annotations

import inspect
import json
import math

import pytest
import torch
from ltx2_fixtures import CAPTION_CHANNELS
from safetensors.torch import load_file

from vidforge.errors import UserInputError
from vidforge.families.ltx2.model import LTX2Model
from vidforge.families.ltx2.network import LTX2Transformer
from vidforge.families.ltx2.published import read_pipeline, read_published
from vidforge.families.ltx2.weights import export_weights, write_export


@pytest.fixture(scope="module")
def folder(ltx2_folder):
    return ltx2_folder()


def test_facts_equal_what_the_pipeline_computes(folder):
    from diffusers import LTX2Pipeline
    from diffusers.pipelines.ltx2.pipeline_ltx2 import calculate_shift

    pipe = LTX2Pipeline.from_pretrained(folder)
    facts = read_pipeline(folder)
    t = pipe.transformer.config
    model = LTX2Model(**facts.model)
    assert (model.layers, model.hidden, model.heads, model.in_channels, model.text_dim) == (
        t.num_layers, t.num_attention_heads * t.attention_head_dim, t.num_attention_heads, t.in_channels,
        t.caption_channels,
    )  # fmt: skip
    assert (model.rope_type, model.rope_base, model.vae_scale) == ("split", (20.0, 256.0, 384.0), (8, 32, 32))
    assert facts.spatial_compression == pipe.vae_spatial_compression_ratio == 32
    assert facts.temporal_compression == pipe.vae_temporal_compression_ratio == 8
    assert facts.default_tokens == 16 * 16 * 24  # 121 frames of 512 x 768
    assert facts.latent_channels == pipe.vae.config.latent_channels == model.in_channels
    assert facts.text_layers == pipe.text_encoder.config.text_config.num_hidden_layers + 1
    assert facts.text_encoder == (folder / "text_encoder").resolve() and facts.connectors is not None
    call = inspect.signature(LTX2Pipeline.__call__).parameters
    assert (facts.size, facts.steps, facts.fps, facts.guidance, facts.caption_tokens) == (
        (call["height"].default, call["width"].default), call["num_inference_steps"].default,
        call["frame_rate"].default, call["guidance_scale"].default, call["max_sequence_length"].default,
    )  # fmt: skip
    # the shift: the pipeline's mu for the default size's tokens, the scheduler's exponential time shift of
    # it, equal to a constant shift of what the facts say
    tokens = facts.default_tokens
    s = pipe.scheduler.config
    mu = calculate_shift(tokens, s.base_image_seq_len, s.max_image_seq_len, s.base_shift, s.max_shift)
    shift = facts.shift.at(tokens)
    sigmas = torch.linspace(0.05, 1.0, 9, dtype=torch.float64)
    torch.testing.assert_close(
        torch.as_tensor(pipe.scheduler.time_shift(mu, 1.0, sigmas)),
        shift * sigmas / (1 + (shift - 1) * sigmas),
    )
    assert math.isclose(shift, math.exp(mu)) and facts.shift.terminal == 0.1
    published = read_published(folder)
    assert published.weights == folder / "transformer" and published.objective == "flow"
    assert published.defaults["diffusion.flow_shift"] == shift and published.defaults["infer.fps"] == 24


def test_a_folder_the_video_path_is_not_built_for_is_refused(folder, tmp_path):
    """Affine block norms, another pipeline's index and a connector of another width: one line each."""
    import shutil

    copy = shutil.copytree(folder, tmp_path / "copy", ignore=shutil.ignore_patterns("*.safetensors"))
    config = json.loads((copy / "transformer/config.json").read_text())
    (copy / "transformer/config.json").write_text(json.dumps({**config, "norm_elementwise_affine": True}))
    with pytest.raises(UserInputError, match="norm_elementwise_affine=True is not built"):
        read_pipeline(copy)
    (copy / "transformer/config.json").write_text(json.dumps(config))
    connectors = json.loads((copy / "connectors/config.json").read_text())
    (copy / "connectors/config.json").write_text(json.dumps({**connectors, "caption_channels": 32}))
    with pytest.raises(UserInputError, match="is 32 wide, the transformer reads 16"):
        read_pipeline(copy)
    index = json.loads((copy / "model_index.json").read_text())
    (copy / "model_index.json").write_text(json.dumps({**index, "_class_name": "WanPipeline"}))
    with pytest.raises(UserInputError, match="LTX2Pipeline"):
        read_pipeline(copy)
    assert read_pipeline(tmp_path) is None  # no LTX-2 config: another family's question


def test_import_then_export_gives_the_transformer_back_bitwise(folder, tmp_path):
    """Every tensor (the audio stream's too) and every config entry; diffusers loads the export with no
    missing or unexpected keys, and the network loads the import's video part and equals the reference."""
    from diffusers import LTX2VideoTransformer3DModel

    write_export(folder, tmp_path / "export")
    back = export_weights(tmp_path / "export", tmp_path / "back")
    original = load_file(folder / "transformer/diffusion_pytorch_model.safetensors")
    returned = load_file(back / "diffusion_pytorch_model.safetensors")
    assert set(returned) == set(original)
    for name, tensor in original.items():
        assert returned[name].dtype == tensor.dtype and torch.equal(
            returned[name].view(torch.uint8), tensor.view(torch.uint8)
        ), name
    assert json.loads((back / "config.json").read_text()) == json.loads(
        (folder / "transformer/config.json").read_text()
    )
    ref, info = LTX2VideoTransformer3DModel.from_pretrained(back, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]

    exported = json.loads((tmp_path / "export/config.json").read_text())
    model = LTX2Transformer(LTX2Model(**exported["model"])).eval()
    model.load_state_dict(load_file(tmp_path / "export/model.safetensors"), strict=True)  # nothing else
    g = torch.Generator().manual_seed(0)
    x, text = torch.randn(1, 4, 2, 4, 6, generator=g), torch.randn(1, 5, CAPTION_CHANNELS, generator=g)
    t = torch.tensor([0.6])
    with torch.no_grad():
        expected, _ = ref.eval()(
            hidden_states=x.flatten(2).transpose(1, 2), audio_hidden_states=torch.randn(1, 3, 4, generator=g),
            encoder_hidden_states=text, audio_encoder_hidden_states=text, timestep=t * 1000, num_frames=2,
            height=4, width=6, fps=24.0, audio_num_frames=3, isolate_modalities=True, return_dict=False,
        )  # fmt: skip
        got = model(x, t, text)
    torch.testing.assert_close(got, expected.transpose(1, 2).unflatten(2, (2, 4, 6)), rtol=1e-5, atol=1e-5)


def test_ltx23_transformer_folder_round_trips(tmp_path):
    """A transformer folder alone, LTX-2.3's variant: its entries read into the model section and written back."""
    from diffusers import LTX2VideoTransformer3DModel

    torch.manual_seed(0)
    LTX2VideoTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, cross_attention_dim=16,
        caption_channels=32, audio_in_channels=4, audio_out_channels=4, audio_num_attention_heads=2,
        audio_attention_head_dim=4, audio_cross_attention_dim=8, num_layers=2, gated_attn=True,
        audio_gated_attn=True, cross_attn_mod=True, audio_cross_attn_mod=True, use_prompt_embeddings=False,
        use_prompt_adaln_single=False, ff_bias=False,
    ).save_pretrained(tmp_path / "transformer")  # fmt: skip
    model = write_export(tmp_path / "transformer", tmp_path / "export")
    assert (model.gated_attention, model.prompt_modulation, model.prompt_modulation_per_step) == (
        True,
        True,
        False,
    )
    assert (model.caption_projection, model.ff_bias, model.text_dim) == (False, False, 16)
    back = export_weights(tmp_path / "export", tmp_path / "back")
    original = load_file(tmp_path / "transformer/diffusion_pytorch_model.safetensors")
    returned = load_file(back / "diffusion_pytorch_model.safetensors")
    assert set(returned) == set(original) and all(torch.equal(returned[k], v) for k, v in original.items())
    assert json.loads((back / "config.json").read_text()) == json.loads(
        (tmp_path / "transformer/config.json").read_text()
    )
