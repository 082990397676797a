"""float8 training of the trained weights (`train.fp8`, torchao's Float8Linear; issue #48, item 2), on the
CPU, where torch runs the float8 matmul (`torch._scaled_mm`) too: the rowwise recipe's forward equals the
product of its operands quantized by hand (e4m3, one power-of-two scale per row of the input and per
output row of the weight), its error against the bf16 product stays within e4m3's, its gradients follow
the high-precision ones, and a tiny Wan network converted whole stays near the unconverted one. Speed is
the GPU suite's (float8 training on/off on the 14B-width stack). Needs torchao (the `gpu` extra)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

pytest.importorskip("torchao", reason="torchao (the `gpu` extra) is not installed")

from vidforge.parallel.float8 import convert_to_float8, float8_config  # noqa: E402

E4M3 = torch.float8_e4m3fn


def quantized(t: torch.Tensor) -> torch.Tensor:
    """`t` through e4m3 with one scale per row (its last dim), the scale a power of two at most 448/amax."""
    t = t.float()
    scale = torch.finfo(E4M3).max / t.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12)
    scale = torch.exp2(torch.floor(torch.log2(scale)))
    return (t * scale).clamp(-448, 448).to(E4M3).float() / scale


def _layers(seed: int = 0) -> tuple[nn.Linear, nn.Sequential]:
    torch.manual_seed(seed)
    plain = nn.Linear(256, 384, bias=False).to(torch.bfloat16)
    converted = nn.Sequential(copy.deepcopy(plain))
    convert_to_float8(converted, "rowwise")
    return plain, converted


def test_the_rowwise_recipe_scales_each_row_of_every_operand() -> None:
    config = float8_config("rowwise")
    granularity = {c.scaling_granularity.name for c in (config.cast_config_input, config.cast_config_weight)}
    assert granularity == {"AXISWISE"} and config.round_scales_to_power_of_2 and config.pad_inner_dim
    assert float8_config("tensorwise").cast_config_input.scaling_granularity.name == "TENSORWISE"
    _, converted = _layers()
    assert type(converted[0]).__name__ == "Float8Linear"


def test_rowwise_float8_forward_is_the_product_of_its_quantized_operands() -> None:
    plain, converted = _layers()
    x = torch.randn(77, 256, dtype=torch.bfloat16)  # 77 tokens: not a multiple of 16 (padded)
    x[5] *= 40  # an outlier token: rowwise scaling keeps it from costing the other rows their precision
    out = converted(x)
    by_hand = quantized(x) @ quantized(plain.weight).T
    torch.testing.assert_close(out.float(), by_hand, rtol=1e-2, atol=1e-2)
    exact = x.float() @ plain.weight.float().T
    error = (out.float() - exact).norm(dim=-1) / exact.norm(dim=-1)
    assert error.max() < 2**-4  # e4m3: 3 mantissa bits on each operand
    assert error.mean() > 2**-9  # and really float8, not the bf16 product (2^-9 is bf16's own step)


def test_rowwise_float8_gradients_follow_the_high_precision_ones() -> None:
    plain, converted = _layers(1)
    x = torch.randn(64, 256, dtype=torch.bfloat16)
    grad = torch.randn(64, 384, dtype=torch.bfloat16)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    plain(x1).backward(grad)
    converted(x2).backward(grad)
    for mine, ref in ((x2.grad, x1.grad), (converted[0].weight.grad, plain.weight.grad)):
        rel = (mine.float() - ref.float()).norm() / ref.float().norm()
        assert 2**-9 < rel < 2**-4


def test_a_converted_wan_network_stays_near_the_unconverted_one() -> None:
    """A tiny Wan network (its blocks' linears in float8, the final layer kept) under bf16 autocast, as
    train.fp8 runs it one process: its prediction and its weights' gradients within float8's error of the
    unconverted network's, on a 4x16x16 latent clip and 29 caption tokens."""
    from test_bench_memory import TINY, WAN

    from vidforge.models import build_model
    from vidforge.profile import load_profile
    from vidforge.tokens import patchify, token_grid

    profile = load_profile(None, [*TINY, *WAN, "model.hidden=128", "model.mlp_hidden=256"])
    torch.manual_seed(0)
    model = build_model(profile.model, device="cpu")
    fp8 = copy.deepcopy(model)
    names = convert_to_float8(fp8, "rowwise")
    assert "blocks.0.attn1.to_q" in names and not any(n.startswith("final") for n in names)
    cfg = model.config
    latents = torch.randn(1, cfg.in_channels, 4, 16, 16)
    text = torch.randn(1, 29, cfg.text_dim)
    grid = token_grid(latents.shape[2:], tuple(cfg.patch))
    x, level = patchify(latents, tuple(cfg.patch)), torch.rand(1)
    outs = []
    for net in (model, fp8):
        with torch.autocast("cpu", torch.bfloat16):
            out = net(x, noise_level=level, text=text, grid=grid)
        out.float().square().mean().backward()
        outs.append(out.float())
    rel = (outs[1] - outs[0]).norm() / outs[0].norm()
    assert 2**-9 < rel < 2**-4
    for (name, p), q in zip(model.named_parameters(), fp8.parameters(), strict=True):
        if p.grad is not None and name.startswith("blocks.0.attn1"):
            rel = (q.grad - p.grad).norm() / p.grad.norm()
            assert rel < 2**-2, name
