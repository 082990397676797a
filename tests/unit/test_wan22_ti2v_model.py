"""Wan2.2 TI2V-5B's transformer against diffusers' own WanTransformer3DModel (tiny random TI2V-like
config, float64): per-token noise levels (diffusers' 2-D timestep, `expand_timesteps`) in a plain batch
and in a packed row; the preset has the published parameter names and shapes."""

import pytest
import torch
from diffusers import WanTransformer3DModel

from vidforge.models import build_model, model_config, pack_latents, unpack_tokens
from vidforge.tokens import patchify

TINY = {"layers": 2, "hidden": 24, "heads": 2, "mlp_hidden": 40, "text_dim": 16, "in_channels": 12}
PATCH = (1, 2, 2)


def _reference(seed=0):
    """diffusers' model with every parameter moved off its initialisation."""
    torch.manual_seed(seed)
    ref = WanTransformer3DModel(
        patch_size=PATCH, num_attention_heads=TINY["heads"], attention_head_dim=TINY["hidden"] // TINY["heads"],
        in_channels=TINY["in_channels"], out_channels=TINY["in_channels"], text_dim=TINY["text_dim"],
        ffn_dim=TINY["mlp_hidden"], num_layers=TINY["layers"], cross_attn_norm=True,
    ).double()  # fmt: skip
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return ref.eval()


def _ours(ref):
    cfg = model_config("wan2.2-ti2v-5b", **TINY)
    model = build_model(cfg, dtype=torch.float64).eval()
    model.load_state_dict(ref.state_dict(), strict=True)
    return model


def _first_frame_zero(t: torch.Tensor, frames: int, per_frame: int) -> torch.Tensor:
    """What WanImageToVideoPipeline(expand_timesteps=True) passes: each sample's t on every token but
    the first latent frame's, which are at 0. (B,) -> (B, S)."""
    levels = t[:, None].expand(-1, frames * per_frame).clone()
    levels[:, :per_frame] = 0
    return levels


def test_per_token_noise_levels_equal_diffusers_2d_timestep():
    ref, g = _reference(), torch.Generator().manual_seed(2)
    model = _ours(ref)
    x = torch.randn(2, TINY["in_channels"], 3, 4, 6, generator=g, dtype=torch.float64)
    text = torch.randn(2, 7, TINY["text_dim"], generator=g, dtype=torch.float64)
    t = torch.rand(2, generator=g, dtype=torch.float64)
    per_frame = (4 // 2) * (6 // 2)
    for levels in (_first_frame_zero(t, 3, per_frame), torch.rand(2, 3 * per_frame, generator=g).double()):
        with torch.no_grad():
            out = model(x, levels, text)
            expected = ref(x, levels * 1000, text, return_dict=False)[0]
        torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    # one level on every token is the per-sample forward (WanPipeline's T2V with expand_timesteps)
    with torch.no_grad():
        same = model(x, t[:, None].expand(-1, 3 * per_frame), text)
        torch.testing.assert_close(same, model(x, t, text), rtol=1e-12, atol=1e-12)


def test_packed_row_with_per_token_levels_equals_each_samples_plain_forward():
    ref, g = _reference(), torch.Generator().manual_seed(3)
    model = _ours(ref)
    shapes = [(2, 4, 6), (3, 2, 4)]
    latents = [torch.randn(TINY["in_channels"], *s, generator=g, dtype=torch.float64) for s in shapes]
    t = torch.rand(2, generator=g, dtype=torch.float64)
    text = torch.randn(2, 5, TINY["text_dim"], generator=g, dtype=torch.float64)
    levels = [_first_frame_zero(t[i : i + 1], s[0], s[1] * s[2] // 4) for i, s in enumerate(shapes)]
    tokens, layout = pack_latents(latents, PATCH)
    with torch.no_grad():
        packed = model(tokens, torch.cat(levels, dim=1), text, layout=layout)
        for i, (got, z) in enumerate(zip(unpack_tokens(packed, layout, PATCH), latents, strict=True)):
            plain = model(z[None], levels[i], text[i : i + 1])[0]
            torch.testing.assert_close(got, plain, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="per-token noise_level must be"):
        model(patchify(latents[0][None], PATCH), levels[0][:, 1:], text[:1], grid=(2, 2, 3))


def test_preset_has_the_published_parameter_names_and_shapes():
    """Wan-AI/Wan2.2-TI2V-5B-Diffusers' transformer/config.json: 30 x 3072 (24 heads of 128), FFN 14336,
    48 channels in and out, umT5's 4096-wide text."""
    with torch.device("meta"):
        ref = WanTransformer3DModel(
            num_attention_heads=24, attention_head_dim=128, ffn_dim=14336, num_layers=30, in_channels=48,
            out_channels=48, text_dim=4096, cross_attn_norm=True,
        )  # fmt: skip
    ours = build_model(model_config("wan2.2-ti2v-5b"), device="meta")
    shapes = {name: tuple(p.shape) for name, p in ours.state_dict().items()}
    assert shapes == {name: tuple(p.shape) for name, p in ref.state_dict().items()}
    assert 4.9e9 < sum(p.numel() for p in ours.parameters()) < 5.1e9
