"""The ltx2 family's network (LTX-2's video path) against diffusers' own LTX2VideoTransformer3DModel on tiny
random configs: the video part of the weights its save_pretrained writes loads by name, strictly, and the
forward equals the reference's video output with the audio cross-attention off (isolate_modalities=True:
diffusers' video-only forward), for both RoPE layouts, a per-token timestep, float64 and float32."""

import pytest
import torch
from diffusers import LTX2VideoTransformer3DModel
from pydantic import ValidationError
from safetensors.torch import load_file

from vidforge.errors import UserInputError
from vidforge.families.ltx2.model import LTX2Model
from vidforge.families.ltx2.network import LTX2Transformer, is_audio, video_state

SHAPE = (2, 8, 3, 4, 6)  # (B, C, F, H, W) latents: three latent frames, a non-square grid
CAPTION = 7  # caption tokens; sample 1's last two are padding
AUDIO = 5  # audio latent frames the reference's audio stream runs on


# LTX-2.3's transformer: gated attention, the caption cross-attention modulated (per step, or by the table
# alone), the caption read at the width (the connector projects it), feed-forwards without bias
LTX23 = {
    "gated_attn": True, "audio_gated_attn": True, "cross_attn_mod": True, "audio_cross_attn_mod": True,
    "use_prompt_embeddings": False, "ff_bias": False, "audio_ff_bias": False, "caption_channels": 16,
}  # fmt: skip


def reference(rope_type="interleaved", seed=0, **variant):
    """A tiny joint audio-video LTX-2 (width 16 = 2 heads of 8: 16 % 6 = 4 RoPE channels padded)."""
    torch.manual_seed(seed)
    variant = {"caption_channels": 12, **variant}
    return (
        LTX2VideoTransformer3DModel(
            in_channels=8,
            out_channels=8,
            num_attention_heads=2,
            attention_head_dim=8,
            cross_attention_dim=16,
            audio_in_channels=4,
            audio_out_channels=4,
            audio_num_attention_heads=2,
            audio_attention_head_dim=4,
            audio_cross_attention_dim=8,
            num_layers=2,
            rope_type=rope_type,
            base_height=256,
            base_width=384,
            **variant,
        )  # fmt: skip
        .double()
        .eval()
    )


def ours(ref, tmp_path, dtype=torch.float64):
    """Our network from the reference's config, with the video part of its save_pretrained folder's
    weights loaded strictly by name."""
    ref.save_pretrained(tmp_path, safe_serialization=True)
    c = ref.config
    config = LTX2Model(
        layers=c.num_layers, hidden=c.num_attention_heads * c.attention_head_dim, heads=c.num_attention_heads,
        in_channels=c.in_channels, text_dim=c.caption_channels, rope_type=c.rope_type, gated_attention=c.gated_attn,
        prompt_modulation=c.cross_attn_mod, prompt_modulation_per_step=c.use_prompt_adaln_single,
        caption_projection=c.use_prompt_embeddings, ff_bias=c.ff_bias,
        rope_base=(c.pos_embed_max_pos, c.base_height, c.base_width), vae_scale=tuple(c.vae_scale_factors),
        frame_rate=25.0,
    )  # fmt: skip
    model = LTX2Transformer(config).to(dtype).eval()
    state = load_file(tmp_path / "diffusion_pytorch_model.safetensors")
    model.load_state_dict({k: v.to(dtype) for k, v in video_state(state).items()}, strict=True)
    return model


def inputs(dtype=torch.float64, seed=1, text_dim=12):
    g = torch.Generator().manual_seed(seed)
    b = SHAPE[0]
    mask = torch.ones(b, CAPTION, dtype=torch.bool)
    mask[1, -2:] = False
    return {
        "x": torch.randn(SHAPE, generator=g, dtype=dtype),
        "t": torch.tensor([0.3, 0.85], dtype=dtype),
        "text": torch.randn(b, CAPTION, text_dim, generator=g, dtype=dtype),
        "mask": mask,
        "audio": torch.randn(b, AUDIO, 4, generator=g, dtype=dtype),
        "audio_text": torch.randn(b, CAPTION, text_dim if text_dim == 12 else 8, generator=g, dtype=dtype),
    }


def reference_out(ref, inp, isolate=True, timestep=None):
    """The reference's video output as the pipeline calls it (latents packed to (B, F*H*W, C), timestep
    1000 t), unpacked to (B, C, F, H, W)."""
    b, c, f, h, w = inp["x"].shape
    with torch.no_grad():
        video, _ = ref(
            hidden_states=inp["x"].flatten(2).transpose(1, 2),
            audio_hidden_states=inp["audio"],
            encoder_hidden_states=inp["text"],
            audio_encoder_hidden_states=inp["audio_text"],
            timestep=inp["t"] * 1000 if timestep is None else timestep * 1000,
            audio_timestep=inp["t"] * 1000,
            sigma=inp["t"] * 1000,  # the pipeline's: the noisy tokens' level
            encoder_attention_mask=inp["mask"].long(),
            audio_encoder_attention_mask=inp["mask"].long(),
            num_frames=f, height=h, width=w, fps=25.0, audio_num_frames=AUDIO,
            isolate_modalities=isolate, return_dict=False,
        )  # fmt: skip
    return video.transpose(1, 2).unflatten(2, (f, h, w))


def out(model, inp, levels=None):
    with torch.no_grad():
        return model(inp["x"], inp["t"] if levels is None else levels, inp["text"], inp["mask"])


@pytest.mark.parametrize("rope_type", ["interleaved", "split"])
def test_forward_equals_diffusers_video_path_float64(rope_type, tmp_path):
    ref = reference(rope_type)
    model = ours(ref, tmp_path)
    inp = inputs()
    expected = reference_out(ref, inp)
    got = out(model, inp)
    assert got.shape == expected.shape == inp["x"].shape
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("per_step", [True, False])
def test_ltx23_forward_equals_diffusers(per_step, tmp_path):
    """LTX-2.3's variant, with a per-token timestep (its prompt modulation reads the per-sample sigma)."""
    ref = reference("split", **LTX23, use_prompt_adaln_single=per_step)
    model = ours(ref, tmp_path)
    inp = inputs(text_dim=16)
    torch.testing.assert_close(out(model, inp), reference_out(ref, inp), rtol=1e-10, atol=1e-10)
    levels = inp["t"][:, None].repeat(1, SHAPE[2] * SHAPE[3] * SHAPE[4])
    levels[:, : SHAPE[3] * SHAPE[4]] = 0.0
    expected = reference_out(ref, inp, timestep=levels)
    torch.testing.assert_close(out(model, inp, levels), expected, rtol=1e-10, atol=1e-10)


def test_forward_equals_diffusers_float32(tmp_path):
    ref = reference("split").float()
    model = ours(ref, tmp_path, torch.float32)
    inp = inputs(torch.float32)
    torch.testing.assert_close(out(model, inp), reference_out(ref, inp), rtol=1e-5, atol=1e-5)


def test_per_token_levels_equal_diffusers(tmp_path):
    """Image-to-video's timestep per token (the first latent frame's at 0), as the pipeline passes it."""
    ref = reference()
    model = ours(ref, tmp_path)
    inp = inputs()
    b, _, f, h, w = SHAPE
    levels = inp["t"][:, None].repeat(1, f * h * w)
    levels[:, : h * w] = 0.0
    expected = reference_out(ref, inp, timestep=levels)
    torch.testing.assert_close(out(model, inp, levels), expected, rtol=1e-10, atol=1e-10)
    assert (expected - reference_out(ref, inp)).abs().max() > 1e-3  # the levels are read


def test_video_path_is_the_reference_without_audio(tmp_path):
    """What the equality rests on, and what would make it fail: with the cross-modal attention off the
    reference's video output ignores the audio stream; with it on, it reads it (so the comparison above is
    against the video-only forward, not a coincidence). The dropped keys are the audio stream's only."""
    ref = reference()
    inp = inputs()
    base = reference_out(ref, inp)
    other = dict(inp, audio=inp["audio"] * 3 + 1, audio_text=inp["audio_text"].flip(1))
    torch.testing.assert_close(reference_out(ref, other), base, rtol=0, atol=0)
    assert (
        reference_out(ref, other, isolate=False) - reference_out(ref, inp, isolate=False)
    ).abs().max() > 1e-3
    kept = set(video_state(ref.state_dict()))
    assert kept and all(not is_audio(k) for k in kept)
    assert {k.split(".")[0] for k in set(ref.state_dict()) - kept} == {
        "audio_proj_in", "audio_caption_projection", "audio_time_embed", "av_cross_attn_video_scale_shift",
        "av_cross_attn_audio_scale_shift", "av_cross_attn_video_a2v_gate", "av_cross_attn_audio_v2a_gate",
        "audio_scale_shift_table", "audio_proj_out", "transformer_blocks",
    }  # fmt: skip


def test_output_depends_on_what_the_reference_reads(tmp_path):
    """A padded caption position is ignored, a valid one is read; the frame rate moves RoPE's time axis."""
    ref = reference()
    model = ours(ref, tmp_path)
    inp = inputs()
    base = out(model, inp)
    padded = dict(inp, text=inp["text"].clone())
    padded["text"][1, -1] += 5.0
    torch.testing.assert_close(out(model, padded), base, rtol=1e-12, atol=1e-12)
    read = dict(inp, text=inp["text"].clone())
    read["text"][1, 0] += 5.0
    assert (out(model, read)[1] - base[1]).abs().max() > 1e-3
    slower = LTX2Transformer(model.config.model_copy(update={"frame_rate": 12.0})).double().eval()
    slower.load_state_dict(model.state_dict())
    assert (out(slower, inp) - base).abs().max() > 1e-6


def test_latents_and_patch_tokens_give_the_same(tmp_path):
    from vidforge.tokens import patchify, token_grid, unpatchify

    model = ours(reference(), tmp_path)
    inp = inputs()
    grid = token_grid(tuple(SHAPE[2:]), (1, 1, 1))
    with torch.no_grad():
        tokens = model(patchify(inp["x"], (1, 1, 1)), inp["t"], inp["text"], inp["mask"], grid=grid)
    torch.testing.assert_close(unpatchify(tokens, grid, (1, 1, 1), 8), out(model, inp))


def test_what_is_not_built_is_refused_in_one_line(tmp_path):
    """The audio stream, packed rows and caption dropout: refused naming the setting."""
    with pytest.raises(ValidationError, match="audio stream is not built"):
        LTX2Model(audio=True)
    model = ours(reference(), tmp_path)
    inp = inputs()
    with pytest.raises(UserInputError, match="caption_dropout"):
        model(inp["x"], inp["t"], inp["text"], inp["mask"], drop_text=torch.tensor([True, False]))
    with pytest.raises(UserInputError, match="data.packing"):
        model(inp["x"], inp["t"], inp["text"], inp["mask"], layout=object())
