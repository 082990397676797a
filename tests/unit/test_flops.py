"""The FLOP counts (`models.flops`, read off a one-block copy of the family's network on the meta
device) against torch's FlopCounterMode over a real forward and backward of the whole network on the
CPU, every layer, every sample of the batch at once."""

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode

from vidforge.families import family
from vidforge.models import SequenceLayout, build_model, forward_flops, model_config, train_step_flops

TEXT_LEN = 5
LATENT = (2, 8, 8)  # token grid (2, 4, 4) with patch (1, 2, 2)
GRID = (2, 4, 4)

VARIANTS = [
    {},
    {"adaln_lora_rank": 8, "mlp_act": "swiglu"},
    {"architecture": "stdit"},
    {"architecture": "stdit", "stdit_block": "parallel", "adaln_lora_rank": 8},
    {"architecture": "stdit", "stdit_block": "parallel-mm", "adaln_lora_rank": 8},
]


def _inputs(cfg, batch=2):
    """(args, keywords) of a forward: a first-frame conditioned model (expand_timesteps) gets a noise level
    per token, an image-to-video one its condition latents and as many image tokens as its family's image
    encoder gives."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, cfg.in_channels, *LATENT, generator=g)
    levels = (batch, GRID[0] * GRID[1] * GRID[2]) if cfg.expand_timesteps else (batch,)  # Wan's patch
    args = (x, torch.rand(levels, generator=g), torch.randn(batch, TEXT_LEN, cfg.text_dim, generator=g))
    keywords = {}
    if cfg.condition_channels:
        keywords["condition"] = torch.randn(batch, cfg.condition_channels, *LATENT, generator=g)
    if cfg.image_dim:
        image = (batch, family(cfg.family).image_tokens, cfg.image_dim)
        keywords["image"] = torch.randn(image, generator=g)
    return args, keywords


def _measure(model, inputs, train):
    args, keywords = inputs
    with FlopCounterMode(display=False) as counter:
        if train:
            model(*args, **keywords).square().mean().backward()
        else:
            with torch.no_grad():
                model(*args, **keywords)
    return counter.get_total_flops()


WAN_TINY = {"layers": 2, "hidden": 48, "heads": 4, "mlp_hidden": 96, "text_dim": 32, "in_channels": 4}
CASES = [("tiny", v) for v in VARIANTS] + [("small", VARIANTS[0]), ("small", VARIANTS[3])]
CASES += [("wan2.1-1.3b", WAN_TINY)]
# Wan2.1-I2V (image tokens through add_k_proj/add_v_proj, condition channels into the patch embedding) and
# Wan2.2 TI2V (a noise level per token: the timestep MLP and time_proj per token)
CASES += [("wan2.1-1.3b", {**WAN_TINY, "image_dim": 24, "condition_channels": 8})]
CASES += [("wan2.1-1.3b", {**WAN_TINY, "expand_timesteps": True})]
# HunyuanVideo-1.5's double-stream blocks (the caption a second stream, joint attention), its token
# refiner, glyph captions and image tokens
HUNYUAN_TINY = {
    "layers": 2,
    "hidden": 64,
    "heads": 4,
    "mlp_hidden": 128,
    "refiner_layers": 1,
    "rope_axes": [4, 6, 6],
}
HUNYUAN_TINY |= {"text_dim": 32, "text_2_dim": 16, "text_2_tokens": 4, "image_dim": 24}
CASES += [("hunyuanvideo1.5-480p-t2v", HUNYUAN_TINY), ("hunyuanvideo1.5-480p-i2v", HUNYUAN_TINY)]


@pytest.mark.parametrize(
    "preset,variant",
    CASES,
    ids=lambda v: v if isinstance(v, str) else "-".join(f"{k}={x}" for k, x in v.items()) or "dit",
)
def test_formula_matches_flop_counter(preset, variant):
    # The dense backend runs attention as explicit matmuls, which FlopCounterMode sees on CPU (it has
    # no formula for CPU SDPA kernels); without packing it does exactly the formula's work.
    cfg = model_config(preset, attention="dense", **variant)
    model = build_model(cfg)
    inputs = _inputs(cfg)
    grid = tuple(n // p for n, p in zip(LATENT, cfg.patch, strict=True))  # HunyuanVideo-1.5's patch is 1
    expected = forward_flops(cfg, [grid, grid], TEXT_LEN, token_levels=cfg.expand_timesteps)
    forward = _measure(model, inputs, train=False)
    step = _measure(model, inputs, train=True)
    assert forward == pytest.approx(expected.forward, rel=0.02)
    assert step == pytest.approx(expected.train_step(), rel=0.02)
    # backward ~2x forward, less the gradients no input needs (at hidden 48 a per-token timestep MLP's
    # first layer, 256 sinusoids in, is 6% of the forward)
    assert 2.8 < step / forward < 3.0


class _Recomputed(nn.Module):
    """A block under full activation checkpointing: its forward runs again in backward."""

    def __init__(self, block):
        super().__init__()
        self.block = block

    def forward(self, x, cond):
        return checkpoint(self.block, x, cond, use_reentrant=False)


def test_full_recompute_adds_the_blocks_forward():
    cfg = model_config("tiny", attention="dense")
    model = build_model(cfg)
    model.blocks = nn.ModuleDict({name: _Recomputed(block) for name, block in model.blocks.items()})
    step = _measure(model, _inputs(cfg), train=True)
    assert step == pytest.approx(
        train_step_flops(cfg, [GRID, GRID], TEXT_LEN, recompute_fraction=1.0), rel=0.02
    )


def test_packed_flops_are_the_sum_of_the_samples():
    cfg = model_config("small", architecture="stdit", stdit_block="parallel")
    layout = SequenceLayout(((2, 4, 4), (3, 2, 6), (1, 8, 8)))
    lens = [7, 3, 12]
    packed = forward_flops(cfg, layout, lens).forward
    alone = sum(forward_flops(cfg, [g], [n]).forward for g, n in zip(layout.grids, lens, strict=True))
    assert packed == alone


def test_attention_grows_quadratically_with_tokens():
    cfg = model_config("dit-1b")
    short = forward_flops(cfg, [(4, 8, 8)], 0).parts["attention"]
    long = forward_flops(cfg, [(8, 8, 8)], 0).parts["attention"]
    assert long == 4 * short


def test_bad_layout_raises():
    with pytest.raises(ValueError, match="text_lens"):
        forward_flops(model_config("tiny"), [GRID, GRID], [3])
