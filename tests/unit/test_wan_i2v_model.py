"""The wan family's image-to-video transformer (Wan2.1-I2V: 36 input channels, a CLIP image embedding read
by cross-attention's add_k_proj/add_v_proj) against diffusers' own WanTransformer3DModel on a tiny random
I2V config (float64): with an image, without one, and in a packed row."""

import pytest
import torch
from diffusers import WanTransformer3DModel

from vidforge.models import build_model, model_config, pack_latents, unpack_tokens
from vidforge.tokens import patchify, token_grid

TINY = {"layers": 2, "hidden": 24, "heads": 2, "mlp_hidden": 40, "text_dim": 16, "in_channels": 4}
CONDITION, IMAGE_DIM, IMAGE_TOKENS = 5, 12, 3
CAPTION = 512  # diffusers' I2V attention takes everything before the last 512 caption tokens as the image's


def _reference(seed=0):
    """diffusers' I2V model with every parameter moved off its initialisation (norm weights included)."""
    torch.manual_seed(seed)
    ref = WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=TINY["heads"],
        attention_head_dim=TINY["hidden"] // TINY["heads"],
        in_channels=TINY["in_channels"] + CONDITION,
        out_channels=TINY["in_channels"],
        text_dim=TINY["text_dim"],
        ffn_dim=TINY["mlp_hidden"],
        num_layers=TINY["layers"],
        cross_attn_norm=True,
        image_dim=IMAGE_DIM,
        added_kv_proj_dim=TINY["hidden"],
    ).double()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return ref.eval()


def _ours(ref, **overrides):
    fields = {**TINY, "condition_channels": CONDITION, "image_dim": IMAGE_DIM, **overrides}
    model = build_model(model_config("wan2.1-1.3b", **fields), dtype=torch.float64).eval()
    model.load_state_dict(ref.state_dict(), strict=True)
    return model


def _inputs(batch=2, shape=(3, 4, 6), seed=2):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, TINY["in_channels"], *shape, generator=g, dtype=torch.float64)
    condition = torch.randn(batch, CONDITION, *shape, generator=g, dtype=torch.float64)
    t = torch.rand(batch, generator=g, dtype=torch.float64)
    text = torch.randn(batch, CAPTION, TINY["text_dim"], generator=g, dtype=torch.float64)
    image = torch.randn(batch, IMAGE_TOKENS, IMAGE_DIM, generator=g, dtype=torch.float64)
    return x, condition, t, text, image


def _reference_out(ref, x, condition, t, text, image):
    with torch.no_grad():
        joined = torch.cat([x, condition], dim=1)
        return ref(joined, t * 1000, text, encoder_hidden_states_image=image, return_dict=False)[0]


def test_i2v_forward_equals_diffusers_with_and_without_an_image():
    ref = _reference()
    model = _ours(ref)
    x, condition, t, text, image = _inputs()
    with torch.no_grad():
        out = model(x, t, text, condition=condition, image=image)
        bare = model(x, t, text, condition=condition)
        grid = token_grid(x.shape[2:], (1, 2, 2))
        tokens = model(
            patchify(x, (1, 2, 2)), t, text, grid=grid, condition=patchify(condition, (1, 2, 2)), image=image
        )
    assert out.shape == x.shape
    torch.testing.assert_close(out, _reference_out(ref, x, condition, t, text, image), rtol=1e-12, atol=1e-12)
    # diffusers without an image attends to no image tokens: that attention adds nothing
    torch.testing.assert_close(bare, _reference_out(ref, x, condition, t, text, None), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(tokens, patchify(out, (1, 2, 2)), rtol=1e-12, atol=1e-12)
    assert not torch.allclose(out, bare)


def test_i2v_packed_row_each_sample_equals_diffusers():
    ref = _reference()
    model = _ours(ref)
    g = torch.Generator().manual_seed(3)
    shapes = [(2, 4, 6), (3, 2, 4)]
    latents = [torch.randn(TINY["in_channels"], *s, generator=g, dtype=torch.float64) for s in shapes]
    conditions = [torch.randn(CONDITION, *s, generator=g, dtype=torch.float64) for s in shapes]
    t = torch.rand(2, generator=g, dtype=torch.float64)
    text = torch.randn(2, CAPTION, TINY["text_dim"], generator=g, dtype=torch.float64)
    image = torch.randn(2, IMAGE_TOKENS, IMAGE_DIM, generator=g, dtype=torch.float64)
    tokens, layout = pack_latents(latents, (1, 2, 2))
    condition, _ = pack_latents(conditions, (1, 2, 2))
    with torch.no_grad():
        packed = model(tokens, t, text, layout=layout, condition=condition, image=image)
    for i, got in enumerate(unpack_tokens(packed, layout, (1, 2, 2))):
        args = (latents[i][None], conditions[i][None], t[i : i + 1], text[i : i + 1], image[i : i + 1])
        torch.testing.assert_close(got, _reference_out(ref, *args)[0], rtol=1e-10, atol=1e-10)


def test_image_inputs_are_refused_where_they_do_not_belong():
    """No --image for an image-to-video model, or over several processes: one line each of the layout
    rulebook's sampling rules, which `vidforge infer` asks before anything loads (a text-to-video model gets
    no condition channels); and a text-to-video model given condition latents."""
    from vidforge.errors import UserInputError
    from vidforge.infer.image_condition import channel_condition
    from vidforge.profile import load_profile
    from vidforge.profile.layout_rules import SamplingRun, sampling_run_problems

    wan = ["model.preset=wan2.1-1.3b", "model.abs_position=none"]
    assert channel_condition(load_profile(None, wan), None, "first.png") is None
    i2v = load_profile(None, [*wan, "model.condition_channels=20", "model.image_dim=1280"])
    (needs,) = sampling_run_problems(i2v, SamplingRun(1))
    assert "give the first frame to animate with --image PATH" in needs
    (one,) = sampling_run_problems(i2v, SamplingRun(2, image=True))
    assert one.startswith("--image: image-conditioned sampling runs in one process, not over 2; drop --nproc")
    model = build_model(model_config("wan2.1-1.3b", **TINY), dtype=torch.float64)
    x, condition, t, text, _ = _inputs()
    with pytest.raises(UserInputError, match="model.condition_channels=0"):
        model(x, t, text[:, :4], condition=condition)
