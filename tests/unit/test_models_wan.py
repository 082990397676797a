"""The wan family against diffusers' own WanTransformer3DModel (tiny random configs, float64): a plain
batch, masked and dropped captions, and packed rows whose every sample equals its own plain forward;
the presets' parameter names and shapes are the published models'."""

import pytest
import torch
from diffusers import WanTransformer3DModel

from vidforge.estimate.param_counts import parameter_counts
from vidforge.models import build_model, model_config, pack_latents, unpack_tokens
from vidforge.profile import Model
from vidforge.tokens import patchify, token_grid

TINY = {"layers": 2, "hidden": 24, "heads": 2, "mlp_hidden": 40, "text_dim": 16, "in_channels": 4}


def _reference(cross_attn_norm=True, seed=0):
    """diffusers' model with every parameter moved off its initialisation (norm weights included)."""
    torch.manual_seed(seed)
    ref = WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=TINY["heads"],
        attention_head_dim=TINY["hidden"] // TINY["heads"],
        in_channels=TINY["in_channels"],
        out_channels=TINY["in_channels"],
        text_dim=TINY["text_dim"],
        ffn_dim=TINY["mlp_hidden"],
        num_layers=TINY["layers"],
        cross_attn_norm=cross_attn_norm,
    ).double()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return ref.eval()


def _ours(ref, **overrides):
    cfg = model_config("wan2.1-1.3b", **{**TINY, "cross_attn_norm": ref.config.cross_attn_norm, **overrides})
    model = build_model(cfg, dtype=torch.float64).eval()
    model.load_state_dict(ref.state_dict(), strict=True)
    return model


def _reference_out(ref, x, t, text):
    with torch.no_grad():
        return ref(x, t * 1000, text, return_dict=False)[0]


def _inputs(batch=2, shape=(3, 4, 6), length=7, seed=2):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, TINY["in_channels"], *shape, generator=g, dtype=torch.float64)
    t = torch.rand(batch, generator=g, dtype=torch.float64)
    text = torch.randn(batch, length, TINY["text_dim"], generator=g, dtype=torch.float64)
    return x, t, text


@pytest.mark.parametrize("cross_attn_norm", [True, False])
def test_plain_batch_equals_diffusers(cross_attn_norm):
    ref = _reference(cross_attn_norm)
    model = _ours(ref)
    x, t, text = _inputs()
    with torch.no_grad():
        out = model(x, t, text)
    torch.testing.assert_close(out, _reference_out(ref, x, t, text), rtol=1e-12, atol=1e-12)


def test_masked_and_dropped_captions_are_wans_zero_padding():
    """Wan's pipeline zero-pads each caption after its real tokens and attends to the pads; a dropped
    caption is all zeros. Tokens with their grid give the same as latents."""
    ref = _reference()
    model = _ours(ref)
    x, t, text = _inputs()
    mask = torch.tensor([[1, 1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1, 0]], dtype=torch.bool)
    drop = torch.tensor([False, True])
    zero_padded = text * mask[..., None]
    zero_padded[1] = 0
    with torch.no_grad():
        out = model(x, t, text, mask, drop_text=drop)
        grid = token_grid(x.shape[2:], (1, 2, 2))
        tokens_out = model(patchify(x, (1, 2, 2)), t, text, mask, grid=grid, drop_text=drop)
    expected = _reference_out(ref, x, t, zero_padded)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(tokens_out, patchify(expected, (1, 2, 2)), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", ["sdpa", "dense"])
def test_packed_row_each_sample_equals_its_plain_forward(backend):
    ref = _reference()
    model = _ours(ref, attention=backend)
    g = torch.Generator().manual_seed(3)
    shapes = [(2, 4, 6), (3, 2, 4), (1, 6, 2)]
    latents = [torch.randn(TINY["in_channels"], *s, generator=g, dtype=torch.float64) for s in shapes]
    t = torch.rand(3, generator=g, dtype=torch.float64)
    text = torch.randn(3, 5, TINY["text_dim"], generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.bool)
    tokens, layout = pack_latents(latents, (1, 2, 2))
    with torch.no_grad():
        packed = model(tokens, t, text, mask, layout=layout)
        plain = [
            model(z[None], t[i : i + 1], text[i : i + 1], mask[i : i + 1])[0] for i, z in enumerate(latents)
        ]
    for i, (got, z) in enumerate(zip(unpack_tokens(packed, layout, (1, 2, 2)), latents, strict=True)):
        torch.testing.assert_close(got, plain[i], rtol=1e-12, atol=1e-12)
        expected = _reference_out(ref, z[None], t[i : i + 1], (text[i : i + 1] * mask[i : i + 1, :, None]))[0]
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


def test_pipeline_stages_pass_hidden_states():
    """A first stage without the output layer and a last stage without the patch embedding compose to
    the whole model (the pipeline split's contract)."""
    ref = _reference()
    whole, first, last = _ours(ref), _ours(ref), _ours(ref)
    first.proj_out = None
    del first.blocks["1"]
    last.patch_embedding = None
    del last.blocks["0"]
    x, t, text = _inputs()
    grid = token_grid(x.shape[2:], (1, 2, 2))
    with torch.no_grad():
        hidden = first(x, t, text)
        out = last(hidden, t, text, grid=grid)
        torch.testing.assert_close(out, patchify(whole(x, t, text), (1, 2, 2)), rtol=0, atol=0)


@pytest.mark.parametrize(
    "preset,layers,heads,head_dim,ffn",
    [("wan2.1-1.3b", 30, 12, 128, 8960), ("wan2.1-14b", 40, 40, 128, 13824)],
)
def test_presets_have_the_published_parameter_names_and_shapes(preset, layers, heads, head_dim, ffn):
    with torch.device("meta"):
        ref = WanTransformer3DModel(
            num_attention_heads=heads, attention_head_dim=head_dim, ffn_dim=ffn, num_layers=layers
        )
    ours = build_model(model_config(preset), device="meta")
    shapes = {name: tuple(p.shape) for name, p in ours.state_dict().items()}
    assert shapes == {name: tuple(p.shape) for name, p in ref.state_dict().items()}


def test_wan_family_refuses_fields_it_does_not_have():
    with pytest.raises(
        ValueError, match="adaln_lora_rank: only the vidforge family has it .the wan family has 0, got 8."
    ):
        Model.model_validate({"preset": "wan2.1-1.3b", "adaln_lora_rank": 8})
    with pytest.raises(ValueError, match="cross_attn_norm: only the wan family"):
        Model.model_validate({"preset": "tiny", "cross_attn_norm": True})


def test_planner_counts_what_tensor_parallel_leaves_whole():
    """Per block, tp replicates the six-vector table, the cross-attention LayerNorm (weight, bias) and
    the three row-wise biases (two to_out.0, ffn.net.2); outside the blocks it splits nothing
    (`vidforge.families.wan.tensor_parallel` leaves time_proj replicated)."""
    cfg = model_config("wan2.1-1.3b")
    counts = parameter_counts(cfg)
    d = cfg.hidden
    assert counts.total == 1_418_996_800
    assert counts.block - counts.block_tp == 6 * d + 2 * d + 3 * d
    assert counts.outside_tp == 0
