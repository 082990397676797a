"""DiT / ST-DiT: packed forward equals per-sample forwards; spatial and temporal attention equal a
direct einsum; adaLN-Zero start; the null caption and the key mask; RoPE is relative."""

import copy
import math

import pytest
import torch

from vidforge.models import (
    SequenceLayout,
    build_model,
    model_config,
    pack_latents,
    patchify,
    unpack_tokens,
    unpatchify,
)
from vidforge.models.layers import SelfAttention
from vidforge.models.rope import apply_rope, rope_tables, sincos_position_embedding
from vidforge.models.scopes import batch_scopes, packed_scopes
from vidforge.profile import PRESETS, Model
from vidforge.tokens import grid_positions

ARCHS = [("dit", "sequential"), ("stdit", "sequential"), ("stdit", "parallel"), ("stdit", "parallel-mm")]


def _perturbed(model, scale=0.05, seed=0):
    """Move every parameter off its (partly zero) initialisation so outputs depend on all of them."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def _tiny(arch="dit", block="sequential", **overrides):
    cfg = model_config("tiny", architecture=arch, stdit_block=block, **overrides)
    torch.manual_seed(0)
    return _perturbed(build_model(cfg, dtype=torch.float64)).eval()


def _samples(n_text=5):
    g = torch.Generator().manual_seed(1)
    latents = [
        torch.randn(4, 2, 4, 6, generator=g, dtype=torch.float64),
        torch.randn(4, 3, 2, 4, generator=g, dtype=torch.float64),
        torch.randn(4, 1, 6, 2, generator=g, dtype=torch.float64),
    ]
    noise = torch.randn(3, generator=g, dtype=torch.float64)
    text = torch.randn(3, n_text, 32, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.bool)
    return latents, noise, text, mask


@pytest.mark.parametrize("backend", ["sdpa", "dense"])
@pytest.mark.parametrize("arch,block", ARCHS)
def test_packed_forward_equals_per_sample_forwards(arch, block, backend):
    # text_pool with the sdpa backend: the pooled caption is per sample in packed rows too
    pool = backend == "sdpa"
    model = _tiny(arch, block, attention=backend, adaln_lora_rank=8, mlp_act="swiglu", text_pool=pool)
    latents, noise, text, mask = _samples()
    tokens, layout = pack_latents(latents, model.config.patch)
    packed = unpack_tokens(model(tokens, noise, text, mask, layout=layout), layout, model.config.patch)
    for i, latent in enumerate(latents):
        alone = model(latent[None], noise[i : i + 1], text[i : i + 1], mask[i : i + 1])[0]
        assert alone.abs().mean() > 0.05  # not a trivially zero output
        torch.testing.assert_close(packed[i], alone, rtol=1e-10, atol=1e-12)


def test_packed_forward_with_flex_on_cpu():
    pytest.importorskip("torch.nn.attention.flex_attention")
    model = _tiny("stdit", "parallel", attention="flex")
    latents, noise, text, mask = _samples()
    tokens, layout = pack_latents(latents, model.config.patch)
    with torch.no_grad():  # FlexAttention has no CPU backward
        try:
            packed = unpack_tokens(
                model(tokens, noise, text, mask, layout=layout), layout, model.config.patch
            )
        except (NotImplementedError, RuntimeError) as err:
            pytest.skip(f"FlexAttention does not run on CPU here: {err}")
        alone = model(latents[1][None], noise[1:2], text[1:2], mask[1:2])[0]
    torch.testing.assert_close(packed[1], alone, rtol=1e-10, atol=1e-12)


def test_plain_batch_equals_per_sample_forwards():
    model = _tiny("stdit", "sequential")
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 4, 2, 4, 4, generator=g, dtype=torch.float64)
    noise, text, mask = _samples()[1:]
    batched = model(x, noise, text, mask)
    for i in range(3):
        torch.testing.assert_close(
            batched[i], model(x[i : i + 1], noise[i : i + 1], text[i : i + 1], mask[i : i + 1])[0]
        )


# --- spatial and temporal attention against einsum ---------------------------------------------------


def _einsum_attention(attn, x, grid, scope):
    """Spatial/temporal attention of one sample written directly over the (t, h, w) axes."""
    t, h, w = grid
    cos, sin = rope_tables(grid_positions(grid), attn.head_dim, dtype=torch.float64)
    q, k, v = (z.reshape(1, t, h, w, attn.heads, attn.head_dim) for z in attn.project(x, (cos, sin)))
    scale = 1 / math.sqrt(attn.head_dim)
    if scope == "spatial":  # within frame t: keys (y, z) of the same t
        scores = torch.einsum("bthwnd,btyznd->bnthwyz", q, k) * scale
        probs = scores.flatten(-2).softmax(-1).unflatten(-1, (h, w))
        out = torch.einsum("bnthwyz,btyznd->bthwnd", probs, v)
    else:  # temporal: at position (h, w), keys at every frame s
        scores = torch.einsum("bthwnd,bshwnd->bnhwts", q, k) * scale
        out = torch.einsum("bnhwts,bshwnd->bthwnd", scores.softmax(-1), v)
    return attn.out(out.reshape(1, t * h * w, -1))


@pytest.mark.parametrize("scope", ["spatial", "temporal"])
def test_factorised_attention_equals_einsum(scope):
    torch.manual_seed(3)
    attn = _perturbed(SelfAttention(32, 4).double())
    grids = [(3, 2, 4), (2, 3, 1)]
    xs = [torch.randn(1, t * h * w, 32, dtype=torch.float64) for t, h, w in grids]
    # Plain batch (two samples of the first grid) ...
    batch = torch.cat([xs[0], 2 * xs[0]])
    cos, sin = rope_tables(grid_positions(grids[0]), attn.head_dim, dtype=torch.float64)
    out = attn(batch, (cos, sin), batch_scopes(2, grids[0])[scope])
    torch.testing.assert_close(out[1:], _einsum_attention(attn, batch[1:], grids[0], scope))
    # ... and a packed row of both grids.
    layout = SequenceLayout(tuple(grids))
    cos, sin = rope_tables(layout.positions(), attn.head_dim, dtype=torch.float64)
    packed = attn(torch.cat(xs, dim=1), (cos, sin), packed_scopes(layout)[scope])
    for i, (start, end) in enumerate(zip(layout.offsets[:-1], layout.offsets[1:], strict=True)):
        torch.testing.assert_close(packed[:, start:end], _einsum_attention(attn, xs[i], grids[i], scope))


def test_spatial_attention_does_not_mix_frames():
    """Changing frame 1 leaves frame 0's spatial attention output untouched (and changes temporal)."""
    torch.manual_seed(4)
    attn = SelfAttention(32, 4).double()
    grid = (2, 2, 2)
    cos, sin = rope_tables(grid_positions(grid), attn.head_dim, dtype=torch.float64)
    x = torch.randn(1, 8, 32, dtype=torch.float64)
    y = x.clone()
    y[:, 4:] += 1.0
    scopes = batch_scopes(1, grid)
    torch.testing.assert_close(
        attn(x, (cos, sin), scopes["spatial"])[:, :4], attn(y, (cos, sin), scopes["spatial"])[:, :4]
    )
    assert not torch.allclose(
        attn(x, (cos, sin), scopes["temporal"])[:, :4], attn(y, (cos, sin), scopes["temporal"])[:, :4]
    )


# --- initialisation, conditioning ------------------------------------------------------------------


@pytest.mark.parametrize("arch,block", ARCHS)
@pytest.mark.parametrize("rank", [0, 4])
def test_fresh_model_is_adaln_zero(arch, block, rank):
    """Zero-initialised modulation and final layer: blocks start as the identity, output starts at 0."""
    model = build_model(model_config("tiny", architecture=arch, stdit_block=block, adaln_lora_rank=rank))
    x = torch.randn(2, 4, 2, 4, 4)
    text = torch.randn(2, 3, 32)
    assert torch.count_nonzero(model(x, torch.zeros(2), text)) == 0
    cond = model.condition(torch.zeros(2), text, batch=2, grid=(2, 2, 2))
    h = torch.randn(2, 8, 64)
    for block_module in model.blocks.values():
        torch.testing.assert_close(block_module(h, cond), h)


def test_adaln_lora_is_low_rank():
    model = build_model(model_config("tiny", adaln_lora_rank=4))
    mod = model.blocks["0"].modulation
    assert mod.down.weight.shape == (4, 64) and mod.up.weight.shape == (9 * 64, 4)
    assert model.shared_modulation.weight.shape == (9 * 64, 64)


@pytest.mark.parametrize("text_pool", [False, True])
def test_null_caption_ignores_the_text(text_pool):
    model = _tiny(text_pool=text_pool)
    x = torch.randn(2, 4, 1, 4, 4, dtype=torch.float64)
    noise = torch.zeros(2, dtype=torch.float64)
    text_a, text_b = torch.randn(2, 2, 5, 32, dtype=torch.float64)
    drop = torch.tensor([True, False])
    out_a = model(x, noise, text_a, drop_text=drop)
    out_b = model(x, noise, text_b, drop_text=drop)
    torch.testing.assert_close(out_a[0], out_b[0])  # dropped caption: the text does not matter
    assert not torch.allclose(out_a[1], out_b[1])  # kept caption: it does


@pytest.mark.parametrize("text_pool", [False, True])
def test_masked_text_tokens_have_no_effect(text_pool):
    model = _tiny(text_pool=text_pool)
    x = torch.randn(1, 4, 1, 4, 4, dtype=torch.float64)
    text = torch.randn(1, 5, 32, dtype=torch.float64)
    mask = torch.tensor([[True, True, False, False, True]])
    changed = text.clone()
    changed[:, 2:4] = 100.0
    noise = torch.zeros(1, dtype=torch.float64)
    torch.testing.assert_close(model(x, noise, text, mask), model(x, noise, changed, mask))


def test_text_pool_carries_the_caption_without_cross_attention():
    """model.text_pool: with every cross-attention silenced the caption still reaches the output, through
    the adaLN modulations; without text_pool it then does not."""
    x = torch.randn(1, 4, 1, 4, 4, dtype=torch.float64)
    noise = torch.zeros(1, dtype=torch.float64)
    text_a, text_b = torch.randn(2, 1, 5, 32, dtype=torch.float64)
    for text_pool in (False, True):
        model = _tiny(text_pool=text_pool)
        with torch.no_grad():
            for block in model.blocks.values():
                block.cross_attn.out.weight.zero_()
                block.cross_attn.out.bias.zero_()
        same = torch.allclose(model(x, noise, text_a), model(x, noise, text_b))
        assert same is not text_pool


def test_rope_depends_only_on_relative_position():
    torch.manual_seed(5)
    q, k = torch.randn(2, 1, 4, 1, 24, dtype=torch.float64)
    pos = torch.tensor([[3, 1, 2], [0, 4, 1], [2, 2, 2], [1, 0, 5]])
    shift = torch.tensor([[5, -2, 7]])

    def scores(p):
        cos, sin = rope_tables(p, 24, dtype=torch.float64)
        return torch.einsum("bqhd,bkhd->qk", apply_rope(q, cos, sin), apply_rope(k, cos, sin))

    torch.testing.assert_close(scores(pos), scores(pos + shift))
    assert not torch.allclose(scores(pos), scores(pos * 2))


def test_sincos_position_embedding_is_the_per_axis_transformer_formula():
    pos = torch.tensor([[0, 0, 0], [2, 5, 7]])
    emb = sincos_position_embedding(pos, 12, torch.float64)  # t, h, w get 4 channels each
    assert emb.shape == (2, 12)
    torch.testing.assert_close(emb[0], torch.tensor([0.0, 0, 1, 1] * 3, dtype=torch.float64))
    for axis, p in enumerate((2, 5, 7)):
        freqs = torch.tensor([1.0, 10000.0**-0.5], dtype=torch.float64)
        expected = torch.cat([torch.sin(p * freqs), torch.cos(p * freqs)])
        torch.testing.assert_close(emb[1, 4 * axis : 4 * axis + 4], expected)


def test_sincos_positions_let_the_model_see_where_a_token_is():
    # Two tokens of the same content side by side: RoPE alone cannot tell them apart (each sees the
    # other at an offset of the same size, and q.R(d)k is even in d when q = k), so their outputs are
    # equal; with absolute positions they differ.
    latents, noise, text, mask = _samples()
    uniform = latents[0][:, :1, :1, :1].expand(4, 1, 1, 2).contiguous()  # (C, T, H, W) = (4, 1, 1, 2)
    for abs_position, differ in (("none", False), ("sincos", True)):
        model = _tiny(abs_position=abs_position, patch=(1, 1, 1))
        out = model(uniform[None], noise[:1], text[:1], mask[:1])
        assert torch.allclose(out[..., 0], out[..., 1]) != differ, abs_position


# --- presets and validation ------------------------------------------------------------------------


def test_presets_have_the_published_shapes():
    wan = Model.model_validate({"preset": "dit-1b"})
    assert (wan.hidden, wan.layers, wan.heads, wan.mlp_hidden, wan.patch) == (1536, 30, 12, 8960, (1, 2, 2))
    for name, shape in {
        "dit-7b": (28, 4096, 32),
        "dit-14b": (40, 5120, 40),
        "dit-28b": (48, 6144, 48),
    }.items():
        cfg = Model.model_validate({"preset": name})
        assert (cfg.layers, cfg.hidden, cfg.heads) == shape
    assert Model.model_validate({"preset": "stdit-12b"}).architecture == "stdit"
    assert set(PRESETS) >= {
        "tiny",
        "small",
        "dit-1b",
        "dit-7b",
        "dit-14b",
        "dit-28b",
        "stdit-7b",
        "stdit-12b",
    }


def test_bad_inputs_name_the_field():
    model = build_model(model_config("tiny"))
    with pytest.raises(ValueError, match="in_channels"):
        model(torch.randn(1, 3, 1, 4, 4), torch.zeros(1), torch.randn(1, 2, 32))
    with pytest.raises(ValueError, match="text_dim"):
        model(torch.randn(1, 4, 1, 4, 4), torch.zeros(1), torch.randn(1, 2, 16))
    with pytest.raises(ValueError, match="patch"):
        model(torch.randn(1, 4, 1, 5, 4), torch.zeros(1), torch.randn(1, 2, 32))
    with pytest.raises(ValueError, match="head size"):
        Model.model_validate({"preset": "tiny", "heads": 16})


def test_pipeline_stages_compose_to_the_whole_model():
    """Splitting the blocks over two stages (first without `final`, second without `patch_embed`, each
    recomputing the conditioning) gives the whole model's output."""
    model = _tiny("stdit", "sequential", adaln_lora_rank=4)
    x = torch.randn(2, 4, 2, 4, 4, dtype=torch.float64)
    noise, text = torch.randn(2, dtype=torch.float64), torch.randn(2, 3, 32, dtype=torch.float64)
    first, second = copy.deepcopy(model), copy.deepcopy(model)
    first.final = None
    del first.blocks["1"]
    second.patch_embed = None
    del second.blocks["0"]
    grid = (2, 2, 2)
    hidden = first(patchify(x, model.config.patch), noise, text, grid=grid)
    out = unpatchify(second(hidden, noise, text, grid=grid), grid, model.config.patch, 4)
    torch.testing.assert_close(out, model(x, noise, text))
